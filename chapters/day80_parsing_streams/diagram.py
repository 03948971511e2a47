"""Day 80's figure: one Hermes call streamed a character at a time, and when each character of
the response reaches the client.

    python chapters/day80_parsing_streams/diagram.py

writes build/figures/day80_parsing_streams/one-call.png. The top strip is the response, one
cell per character, coloured by what the whole reading makes of it: content, markup (the
markers and the JSON around the name and the arguments, which no client sees), the name, the
arguments. Below it, for a stream fed one character at a time, the number of characters each
one waits between arriving and going out: the snapshot's reader, then the package's. A tail
that could still become ``<tool_call>`` waits until it cannot; markup never goes out.

Nothing is timed; the waits are counted in characters fed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day80_parsing_streams import corpus as cp  # noqa: E402
from chapters.day80_parsing_streams import streams as st  # noqa: E402
from chapters.day80_parsing_streams.snapshot import hermes  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

EXAMPLE = ('Yes: <tool is text. <tool_call>\n{"name": "search", "arguments": '
           '{"query": "Paris"}}\n</tool_call>')
ROLE_COLOR = {"content": COLORS["reference"], "markup": COLORS["muted"],
              "name": COLORS["highlight"], "arguments": COLORS["compute"]}


def roles(text: str) -> list[str]:
    """Each character's role in the whole reading (the snapshot's rules)."""
    out = ["content"] * len(text)
    pos = 0
    while (i := text.find(hermes.START, pos)) >= 0 and (j := text.find(hermes.END, i)) >= 0:
        body_at = i + len(hermes.START)
        call = hermes.read_call(text[body_at:j], cp.NAMES)
        if call is not None:
            out[i:j + len(hermes.END)] = ["markup"] * (j + len(hermes.END) - i)
            n = text.index(f'"{call.name}"', body_at) + 1
            out[n:n + len(call.name)] = ["name"] * len(call.name)
            a = text.index(call.arguments, n)
            out[a:a + len(call.arguments)] = ["arguments"] * len(call.arguments)
        pos = j + len(hermes.END)
    return out


def waits(reader, text: str, role: list[str]) -> list[int | None]:
    """For each character, the characters fed between its arrival and its release (None:
    never released, the markup)."""
    released: dict[str, list[int]] = {"content": [], "name": [], "arguments": []}
    pieces = list(text)

    def note(step: int, content: str, calls: list) -> None:
        released["content"] += [step] * len(content)
        for _, _, name, arguments in calls:
            released["name"] += [step] * len(name or "")
            released["arguments"] += [step] * len(arguments)

    feed, finish = _feeders(reader)
    for step, p in enumerate(pieces):
        note(step, *feed(p))
    note(len(pieces), *finish())
    seen = {k: 0 for k in released}
    out: list[int | None] = []
    for i, r in enumerate(role):
        if r == "markup":
            out.append(None)
            continue
        out.append(released[r][seen[r]] - i)
        seen[r] += 1
    return out


def _feeders(reader):
    """feed/finish returning (content, [(index, id, name, arguments)]) for either adapter."""
    if isinstance(reader, st.SnapshotHermes):
        s = reader.stream_cls(reader.names)

        def unpack(d):
            return d.content, [(c.index, None, c.name, c.arguments) for c in d.calls]
    else:
        s = reader.cls(reader.tools)

        def unpack(d):
            return d.content, [(c.index, c.id, c.name, c.arguments) for c in d.calls]
    return (lambda x: unpack(s.feed(x))), (lambda: unpack(s.finish()))


def main() -> None:
    role = roles(EXAMPLE)
    readers = [("the snapshot", st.SnapshotHermes(cp.NAMES)),
               ("the package", st.PackageTools("hermes", cp.TOOLS))]
    fig, axes = figure(width=12, height=6.2, nrows=1 + len(readers), sharex=True,
                       gridspec_kw={"height_ratios": [0.6] + [1] * len(readers)})
    x = range(len(EXAMPLE))
    strip = axes[0]
    strip.bar(x, 1, width=1, color=[ROLE_COLOR[r] for r in role], edgecolor="white",
              linewidth=0.3)
    for i, ch in enumerate(EXAMPLE):
        strip.text(i, 0.5, {"\n": "⏎", " ": "·"}.get(ch, ch), ha="center", va="center",
                   fontsize=6.5, family="DejaVu Sans Mono",
                   color=COLORS["ink"] if role[i] in ("markup", "name") else "white")
    strip.set_yticks([])
    strip.grid(False)
    strip.set_title("the response, coloured by the whole reading", fontsize=11)
    for r, c in ROLE_COLOR.items():
        strip.bar([0], [0], color=c, label=r)
    strip.legend(fontsize=8, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.02))
    for ax, (title, reader) in zip(axes[1:], readers, strict=True):
        w = waits(reader, EXAMPLE, role)
        ax.bar([i for i in x if w[i] is not None], [v for v in w if v is not None], width=0.9,
               color=[ROLE_COLOR[role[i]] for i in x if w[i] is not None])
        ax.set_ylabel("characters\nwaited")
        ax.set_title(f"{title}, fed one character at a time", fontsize=11)
    axes[-1].set_xlabel("character of the response")
    fig.suptitle("What a stream holds back, and for how long", fontsize=12,
                 fontweight="bold", y=1.0)
    save(fig, __file__, "one-call")


if __name__ == "__main__":
    main()

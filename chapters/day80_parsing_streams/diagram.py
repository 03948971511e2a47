"""Day 80's figure: one Hermes call streamed a character at a time, and how long each
character of the response waits before it reaches the client.

    python chapters/day80_parsing_streams/diagram.py

writes build/figures/day80_parsing_streams/one-call.png. The top strip is the response, one
cell per character, coloured by what the whole reading makes of it: content, markup (the
markers and the JSON around the name and the arguments, which no client sees), the name and
the arguments. Below it, for a stream fed one character at a time, the number of characters
that arrive after each one before it goes out, in the package's two modes: the server's
default, which sends a call only once its object has closed and been judged, and
``early=True``, vLLM's, which sends a call as soon as its name is known and streams its
arguments (the snapshot agrees with both). A tail that could still become ``<tool_call>``
waits until it cannot; markup never goes out.

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
    """Each character's role in the whole reading of ``EXAMPLE`` (one call, text before it)."""
    i, j = text.index(hermes.START), text.index(hermes.END) + len(hermes.END)
    body = text.index("{", i)
    name, a, b = hermes.judge(text[body:text.rindex("}", 0, j) + 1], cp.NAMES)
    out = ["content"] * i + ["markup"] * (j - i) + ["content"] * (len(text) - j)
    n = text.index(f'"{name}"', body) + 1
    out[n:n + len(name)] = ["name"] * len(name)
    out[body + a:body + b] = ["arguments"] * (b - a)
    return out


def waits(reader, text: str, role: list[str]) -> list[int | None]:
    """For each character, how many characters arrived after it before it went out (None for
    markup, which never goes out)."""
    left: dict[str, list[int]] = {"content": [], "name": [], "arguments": []}
    feed, finish = reader.feeders()
    for step, ch in enumerate([*text, None]):
        content, pieces = feed(ch) if ch is not None else finish()
        left["content"] += [step] * len(content)
        for _, _, name, arguments in pieces:
            left["name"] += [step] * len(name or "")
            left["arguments"] += [step] * len(arguments)
    seen = {k: 0 for k in left}
    out: list[int | None] = []
    for i, r in enumerate(role):
        if r == "markup":
            out.append(None)
            continue
        out.append(left[r][seen[r]] - i)
        seen[r] += 1
    return out


def main() -> None:
    role = roles(EXAMPLE)
    readers = [("the server's default: a call goes out once its object is judged",
                st.PackageTools("hermes", cp.TOOLS)),
               ("early=True, vLLM's: a call goes out once its name is known",
                st.PackageTools("hermes", cp.TOOLS, early=True))]
    fig, axes = figure(width=12, height=6.4, nrows=1 + len(readers), sharex=True,
                       gridspec_kw={"height_ratios": [0.55] + [1] * len(readers)})
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
        axes[1].bar([0], [0], color=c, label=r)
    axes[1].legend(fontsize=8, ncols=4, loc="upper right")
    top = 0
    for ax, (title, reader) in zip(axes[1:], readers, strict=True):
        w = waits(reader, EXAMPLE, role)
        shown = [i for i in x if w[i] is not None]
        ax.bar(shown, [w[i] for i in shown], width=0.9,
               color=[ROLE_COLOR[role[i]] for i in shown])
        top = max(top, *(w[i] for i in shown))
        ax.set_ylabel("characters\nwaited")
        ax.set_title(title, fontsize=11)
    for ax in axes[1:]:
        ax.set_ylim(0, top + 2)
    axes[-1].set_xlabel("character of the response, fed one at a time")
    fig.suptitle("What a stream holds back, and for how long", fontsize=12,
                 fontweight="bold", y=1.0)
    save(fig, __file__, "one-call")


if __name__ == "__main__":
    main()

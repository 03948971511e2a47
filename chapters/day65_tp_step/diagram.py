"""Day 65's figure: one tensor-parallel step on two ranks, and the message that starts it.

    python chapters/day65_tp_step/diagram.py

writes build/figures/day65_tp_step/tp-step.png:

- top: one decode step as two lanes, rank 0 and rank 1, on a schematic clock (durations are
  illustrative, not measured). Each rank runs its own work and waits at every collective until
  the other arrives: the message's broadcast, the embedding's all-reduce, two all-reduces per
  layer of the shipped model (its layer count read from its config.json) and the gather of the
  logits' shards onto rank 0. Rank 0 alone schedules and samples; rank 1 alone replays.
- bottom: a decode message and a prefill message laid out cell by cell at the start of the
  1024-cell header, coloured by field. Both are encoded, decoded and replayed by the frozen
  snapshot, so the picture is the snapshot's layout, not a drawing of it.

Nothing is spawned, loaded or timed.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.common import SHIPPED  # noqa: E402
from chapters.day65_tp_step.snapshot import step as frozen  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

LAYERS = json.loads((SHIPPED / "config.json").read_text())["num_hidden_layers"]

# Schematic durations, in arbitrary units: a picture of the order, not of the cost.
WORK = {"schedule": 1.6, "journal": 0.4, "replay": 0.5, "embed": 0.35, "attention": 0.9,
        "mlp": 0.9, "logits": 0.45, "sample": 0.8}
COLLECTIVE = {"broadcast": 0.45, "all-reduce": 0.22, "gather": 0.3}
ROLE = {"schedule": "highlight", "journal": "memory", "replay": "memory", "sample": "highlight",
        "embed": "compute", "attention": "compute", "mlp": "compute", "logits": "compute"}


def timeline() -> tuple[list[list[tuple]], list[tuple]]:
    """Each rank's segments (start, length, name, kind) and the collectives (start, length,
    name), by running both ranks' programs on one clock: a collective starts when the later
    rank reaches it, and the earlier one waits."""
    forward = ["embed", "all-reduce"] + ["attention", "all-reduce", "mlp", "all-reduce"] * LAYERS
    programs = [["schedule", "journal", "broadcast", *forward, "logits", "gather", "sample"],
                ["broadcast", "replay", *forward, "logits", "gather"]]
    clock, pc = [0.0, 0.0], [0, 0]
    lanes: list[list[tuple]] = [[], []]
    collectives = []
    while any(pc[r] < len(programs[r]) for r in (0, 1)):
        for r in (0, 1):  # each rank runs its own work until it reaches a collective
            while pc[r] < len(programs[r]) and programs[r][pc[r]] in WORK:
                name = programs[r][pc[r]]
                lanes[r].append((clock[r], WORK[name], name, "work"))
                clock[r] += WORK[name]
                pc[r] += 1
        if all(pc[r] < len(programs[r]) for r in (0, 1)):
            name = programs[0][pc[0]]
            assert programs[1][pc[1]] == name, "the ranks must meet at the same collective"
            start = max(clock)
            for r in (0, 1):
                if start > clock[r]:
                    lanes[r].append((clock[r], start - clock[r], "wait", "wait"))
                lanes[r].append((start, COLLECTIVE[name], name, "collective"))
                clock[r] = start + COLLECTIVE[name]
                pc[r] += 1
            collectives.append((start, COLLECTIVE[name], name))
    return lanes, collectives


def draw_timeline(ax) -> None:
    lanes, collectives = timeline()
    y = {0: 1.2, 1: 0.0}
    for r, segs in enumerate(lanes):
        for start, length, name, kind in segs:
            if kind == "wait":
                ax.add_patch(Rectangle((start, y[r] + 0.3), length, 0.2, facecolor="none",
                                       edgecolor=COLORS["reference"], hatch="///",
                                       linewidth=0.0))
                continue
            color = COLORS["ink"] if kind == "collective" else COLORS[ROLE[name]]
            ax.add_patch(Rectangle((start, y[r]), length, 0.8, facecolor=color,
                                   edgecolor=COLORS["paper"], linewidth=0.6))
            if kind == "work" and name not in ("attention", "mlp") or \
                    name in ("attention", "mlp") and start < 5:
                ax.text(start + length / 2, y[r] + 0.4, name, ha="center", va="center",
                        fontsize=7.5, color=COLORS["paper"], rotation=90 if length < 0.6 else 0)
    reduces = sum(name == "all-reduce" for _, _, name in collectives)
    for start, length, _ in collectives:
        ax.plot([start + length / 2] * 2, [0.8, 1.2], color=COLORS["ink"], linewidth=1.0)
    first = {name: start + length / 2 for start, length, name in reversed(collectives)}
    for name, label in (("broadcast", "broadcast: the message"),
                        ("gather", "gather: logit shards to rank 0")):
        ax.annotate(label, (first[name], 2.0), (first[name], 2.45), ha="center", fontsize=8.5,
                    arrowprops=dict(arrowstyle="-|>", color=COLORS["ink"]))
    reduce_at = [s + n / 2 for s, n, name in collectives if name == "all-reduce"]
    middle = reduce_at[len(reduce_at) // 2]
    for x in (reduce_at[0], middle):
        ax.annotate("", (x, 0.0), (middle, -0.45),
                    arrowprops=dict(arrowstyle="-|>", color=COLORS["ink"], shrinkB=1))
    ax.text(middle, -0.5, f"{reduces} all-reduces: the embedding's, then two per layer over the "
            f"shipped model's {LAYERS} layers", ha="center", va="top", fontsize=8.5)
    end = max(s + n for segs in lanes for s, n, _, _ in segs)
    last = max(s + n for s, n, _, _ in lanes[1])
    ax.add_patch(Rectangle((last, 0.3), end - last, 0.2, facecolor="none", hatch="///",
                           edgecolor=COLORS["reference"], linewidth=0.0))  # the next message
    ax.set_xlim(-0.2, end + 0.3)
    ax.set_ylim(-0.85, 2.8)
    ax.set_yticks([0.4, 1.6], ["rank 1\n(worker)", "rank 0\n(driver)"])
    ax.set_xticks([])
    ax.set_xlabel("schematic time within one decode step (not to scale)")
    ax.grid(False)
    ax.legend(handles=[
        Patch(color=COLORS["highlight"], label="rank 0 only: schedule, sample"),
        Patch(color=COLORS["memory"], label="addressing: take the journal / replay it"),
        Patch(color=COLORS["compute"], label="this rank's half of the forward"),
        Patch(color=COLORS["ink"], label="collective (both ranks)"),
        Patch(facecolor="none", edgecolor=COLORS["reference"], hatch="///",
              label="waiting for the other rank"),
    ], loc="upper center", ncols=5, fontsize=8, bbox_to_anchor=(0.5, -0.12))
    ax.set_title("One decode step on two ranks: a broadcast in, the same all-reduces, a gather "
                 "out", fontsize=11.5, loc="left")


# Two messages, as rank 0 might send them: a decode step of four rows in which row 2 crosses
# into a new block, and the prefill that starts a second wave after the first one finished.
DECODE = (frozen.DECODE, [0, 1, 2, 3], [[17], [42], [5], [99]], [], [frozen.EXTEND, 2, 1, 9])
PREFILL = (frozen.PREFILL, [0, 1, 2, 3], [[3, 8, 8, 2], [11, 4, 6], [9, 9, 4, 1, 7], [2, 5]],
           [], [frozen.RESET, 0, frozen.RESET, 1, frozen.RESET, 2, frozen.RESET, 3,
                frozen.EXTEND, 0, 1, 12, frozen.EXTEND, 1, 1, 13, frozen.EXTEND, 2, 1, 14,
                frozen.EXTEND, 3, 1, 15])
FIELDS = [("length", "ink"), ("kind, B, nhold, njournal", "reference"), ("rows", "compute"),
          ("lens", "compute"), ("hold", "waste"), ("journal", "memory"),
          ("tokens", "highlight")]
SHOWN = 64  # header cells drawn; the other 1024 - SHOWN are zeros, drawn as one block


def cells(message) -> list[str]:
    """The field of each header cell, from the snapshot's own encoding of ``message``."""
    ints = frozen.encode(*message)
    kind, rows, tokens, hold, journal = frozen.decode(ints)
    assert (kind, rows, tokens, hold, journal) == message
    tables = {r: [] for r in rows}
    frozen.apply(tables, {}, journal)  # the journal must replay, or the picture is wrong
    b = len(rows)
    sizes = [1, 4, b, b, len(hold), len(journal), sum(len(t) for t in tokens)]
    assert sum(sizes) == len(ints) + 1 and frozen.broadcasts(ints) == 1
    return [name for (name, _), n in zip(FIELDS, sizes, strict=True) for _ in range(n)]


def draw_messages(ax) -> None:
    color = {name: COLORS[role] for name, role in FIELDS}
    for y, (label, message) in enumerate((("prefill", PREFILL), ("decode", DECODE))):
        fields = cells(message)
        for i in range(SHOWN):
            name = fields[i] if i < len(fields) else None
            ax.add_patch(Rectangle((i, y), 0.92, 0.7, edgecolor="none",
                                   facecolor=color[name] if name else COLORS["muted"],
                                   alpha=0.6 if name == "lens" else 1.0))
        ax.add_patch(Rectangle((SHOWN + 0.5, y), 6, 0.7, facecolor=COLORS["muted"],
                               edgecolor="none"))
        ax.text(SHOWN + 3.5, y + 0.35, "...", ha="center", va="center", fontsize=9)
        ax.text(SHOWN + 7.2, y + 0.35, f"{len(fields)} of {frozen.HEADER} cells used: one "
                f"broadcast of {frozen.HEADER * 8:,} B", va="center", fontsize=8.5)
        ax.text(-1, y + 0.35, label, ha="right", va="center", fontsize=9.5)
    ax.set_xlim(-8, SHOWN + 38)
    ax.set_ylim(-0.2, 2.0)
    ax.axis("off")
    ax.legend(handles=[Patch(color=COLORS[role], alpha=0.6 if name == "lens" else 1.0,
                             label=name) for name, role in FIELDS],
              loc="upper center", ncols=7, fontsize=8, bbox_to_anchor=(0.5, 1.02))
    ax.set_title(f"The message inside the header: the first {SHOWN} of {frozen.HEADER} int64 "
                 f"cells, as the snapshot encodes them", fontsize=11.5, loc="left")


if __name__ == "__main__":
    fig, axes = figure(width=12, height=7.4, nrows=2, height_ratios=[1.7, 1])
    draw_timeline(axes[0])
    draw_messages(axes[1])
    fig.tight_layout()
    save(fig, __file__, "tp-step")

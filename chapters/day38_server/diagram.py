"""Day 38's figure: how one HTTP request travels through the server and back.

    python chapters/day38_server/diagram.py

writes build/figures/day38_server/request-path.png: the event-loop side (FastAPI, the tokenizer,
the fan-out of n engine requests), the two doors into and out of the engine thread (the inbox
and ``call_soon_threadsafe``), and the engine side (core.step: scheduler, model, detokenizer).
Nothing is measured; the boxes name the functions in nanoserve/entrypoints/openai/ and
async_engine.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import FancyArrowPatch  # noqa: E402

from diagrams import COLORS, box, figure, save  # noqa: E402


def arrow(ax, a, b, text="", color="ink", rad=0.0, dy=0.12):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=13,
                                 color=COLORS[color], linewidth=1.3,
                                 connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + dy, text, ha="center", va="bottom",
                fontsize=8.5, color=COLORS["ink"])


def main() -> None:
    fig, ax = figure(width=11, height=5.6)
    ax.set_xlim(0, 11)
    ax.set_ylim(0.4, 5.75)
    ax.axis("off")
    # the two sides
    ax.add_patch(__import__("matplotlib").patches.Rectangle(
        (0.1, 2.95), 10.8, 2.2, facecolor=COLORS["muted"], edgecolor="none"))
    ax.text(0.2, 4.95, "event loop (asyncio): one per server, never blocks", fontsize=9.5,
            color=COLORS["reference"], va="top")
    ax.text(0.2, 2.6, "engine thread: one forward at a time", fontsize=9.5,
            color=COLORS["reference"])

    w, h = 1.55, 0.75
    top = 3.55
    steps = [("client\nPOST /v1/...", "reference"), ("read_json\n413 / 400", "highlight"),
             ("parse + checks\n400 param, 404", "highlight"), ("tokenizer\nencode / chat",
                                                                "compute"),
             ("Fanout\nn engine requests", "compute"), ("Choice / SSE\nusage, deltas",
                                                         "compute")]
    xs = [0.25 + i * 1.8 for i in range(len(steps))]
    for x, (t, c) in zip(xs, steps, strict=True):
        box(ax, x, top, w, h, t, color=c, fontsize=8.8)
    for a, b in zip(xs[:4], xs[1:5], strict=True):
        arrow(ax, (a + w, top + h / 2), (b, top + h / 2))
    # errors go straight back
    ax.text(xs[1] + 0.05, top - 0.42, "any failure here: {\"error\": {message, type, "
            "param, code}} and the HTTP status; the engine never hears of it",
            fontsize=8.5, color=COLORS["waste"])
    # down into the engine
    engine = [("inbox\n(add / abort)", "memory"), ("core.step()\nschedule + forward",
                                                   "compute"),
              ("RequestDelta\ntokens, text", "memory")]
    ex = [xs[4] - 3.0, xs[4] - 0.7, xs[4] + 1.6]
    low = 1.1
    for x, (t, c) in zip(ex, engine, strict=True):
        box(ax, x, low, w, h, t, color=c, fontsize=8.8)
    arrow(ax, (xs[4] + 0.3, top), (ex[0] + w / 2, low + h), "engine.generate(ids, params, id)",
          rad=0.15, dy=0.0)
    arrow(ax, (ex[0] + w, low + h / 2), (ex[1], low + h / 2))
    arrow(ax, (ex[1] + w, low + h / 2), (ex[2], low + h / 2))
    arrow(ax, (ex[2] + w / 2, low + h), (xs[5] + w / 2, top), "call_soon_threadsafe",
          rad=0.0, dy=0.0)
    arrow(ax, (xs[5] + w / 2, top + h), (xs[0] + w / 2, top + h), "", rad=0.25)
    ax.text((xs[0] + xs[5]) / 2 + w / 2, 5.42, "JSON response, or data: chunks ... data: [DONE]",
            ha="center", fontsize=8.8, color=COLORS["ink"])
    ax.text(ex[1] + w / 2, low - 0.4, "the inbox is taken whole at the top of every iteration: "
            "an abort lands before the next forward", ha="center", fontsize=8.5,
            color=COLORS["ink"])
    fig.suptitle("Day 38: one request through nanoserve's server (HTTP -> tokenizer -> AsyncLLM "
                 "-> core -> deltas -> response)", fontsize=11.5, fontweight="bold", y=0.98)
    save(fig, __file__, "request-path")


if __name__ == "__main__":
    main()

"""Day 39's figure: what a stream looks like on the wire, and what a hang-up sets off.

    python chapters/day39_streaming_abort/diagram.py

writes build/figures/day39_streaming_abort/stream-and-hangup.png. Left: the events of one chat
stream with include_usage (the shape the claims count: a role event, one event per piece of
text, the finish_reason on the last of them, a usage event, data: [DONE]). Right: a client that
hangs up during iteration k: the server's abort() lands in the inbox, and the engine frees the
request's blocks at the top of iteration k+1, before that iteration's forward. A schematic;
nothing is measured here.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from diagrams import COLORS, box, figure, save  # noqa: E402

EVENTS = [
    ('data: {"choices":[{"delta":{"role":"assistant","content":""}}]}', "highlight"),
    ('data: {"choices":[{"delta":{"content":" raise"}}]}', "compute"),
    ('data: {"choices":[{"delta":{"content":" an"}}]}', "compute"),
    ("  ... one event per piece of text ...", "muted"),
    ('data: {"choices":[{"delta":{"content":" the"},"finish_reason":"length"}]}', "compute"),
    ('data: {"choices":[],"usage":{"prompt_tokens":25,"completion_tokens":8,...}}', "memory"),
    ("data: [DONE]", "reference"),
]


def main() -> None:
    fig, (left, right) = figure(width=12, height=4.8, ncols=2,
                                gridspec_kw={"width_ratios": [1.25, 1.0], "wspace": 0.05})
    left.set_xlim(0, 10)
    left.set_ylim(0, len(EVENTS) + 0.8)
    left.axis("off")
    for i, (text, color) in enumerate(EVENTS):
        y = len(EVENTS) - 1 - i + 0.2
        box(left, 0.1, y, 9.8, 0.72, text, color=color, fontsize=8.2,
            text_color=COLORS["ink"] if color == "muted" else "white")
    left.set_title("one chat stream with include_usage: 'data: <json>', blank line, ...",
                   fontsize=10, loc="left")

    right.set_xlim(0, 10)
    right.set_ylim(0, 6)
    right.axis("off")
    for k, x in enumerate((0.5, 3.6, 6.7)):
        box(right, x, 3.6, 2.8, 0.8, f"iteration {['k', 'k+1', 'k+2'][k]}:\nforward",
            color="compute" if k < 1 else "reference", fontsize=9)
    right.annotate("", xy=(1.6, 4.45), xytext=(1.6, 5.5),
                   arrowprops=dict(arrowstyle="-|>", color=COLORS["waste"], lw=1.4))
    right.text(1.6, 5.6, "client hangs up; server calls abort()", ha="center", fontsize=9,
               color=COLORS["waste"])
    box(right, 3.0, 2.2, 4.6, 0.9, "top of k+1: inbox taken,\nabort_request frees the blocks",
        color="memory", fontsize=8.6)
    right.annotate("", xy=(3.0, 2.65), xytext=(2.0, 3.55),
                   arrowprops=dict(arrowstyle="-|>", color=COLORS["ink"], lw=1.1))
    right.text(5.0, 1.4, "the request is not in k+1's batch;\nits blocks are free for "
               "anyone admitted in k+1", ha="center", fontsize=9, color=COLORS["ink"])
    right.text(5.0, 0.45, "streaming: the server sees the disconnect at once;\n"
               "non-streaming: the 50 ms watcher notices", ha="center", fontsize=8.5,
               color=COLORS["reference"])
    right.set_title("a hang-up during iteration k", fontsize=10, loc="left")
    fig.suptitle("Day 39: streaming and abort on disconnect", fontsize=12, fontweight="bold",
                 y=0.99)
    save(fig, __file__, "stream-and-hangup")


if __name__ == "__main__":
    main()

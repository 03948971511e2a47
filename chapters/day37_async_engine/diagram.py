"""Day 37's figure: one run of the async engine as two timelines, the engine thread's forwards
and the event loop's heartbeat, and the loop's worst lateness with and without the thread.

    python chapters/day37_async_engine/diagram.py

writes build/figures/day37_async_engine/async-engine.png. Measured here, on this 2-core x86 CPU
with nanoserve-tiny (float32, greedy, EOS ignored, block_size 4, 64 blocks, 4 slots, one torch
thread): four streams with 200-token prompts and 24 tokens each, a fifth stream cancelled after
five deltas, 0.3 s with nothing to do, then four short streams. Times move with the machine's
load; the shape does not.
"""

import asyncio
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from chapters.common import SHIPPED  # noqa: E402
from chapters.day36_engine_core.claims import greedy  # noqa: E402
from chapters.day37_async_engine.claims import SHAPE, settle, stream  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402
from nanoserve import LLM  # noqa: E402
from nanoserve.async_engine import AsyncLLM  # noqa: E402

PROMPTS = [[60 + i] * 200 for i in range(4)]


async def heartbeat(t0: float, done: asyncio.Event, beats: list):
    while not done.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        beats.append((t - t0, (time.perf_counter() - t - 0.001) * 1e3))


def run_threaded() -> dict:
    e = AsyncLLM.from_options(SHIPPED, **SHAPE)
    e.start()
    spans, step = [], e.core.engine.step

    def timed_step(out):
        t = time.perf_counter()
        try:
            return step(out)
        finally:
            spans.append((t, time.perf_counter()))

    e.core.engine.step = timed_step
    events = {}

    async def main():
        t0, done, beats = time.perf_counter(), asyncio.Event(), []
        hb = asyncio.create_task(heartbeat(t0, done, beats))
        await asyncio.sleep(0.02)
        events["four streams"] = time.perf_counter() - t0
        got = []

        async def leaver():
            async for d in e.generate([9] * 7, greedy(200), "gone"):
                got.append(d)

        first = asyncio.gather(*(stream(e, f"p{i}", p, greedy(24)) for i, p in enumerate(PROMPTS)))
        gone = asyncio.create_task(leaver())
        await settle(lambda: len(got) >= 5)
        events["cancel"] = time.perf_counter() - t0
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        await first
        await settle(lambda: not e.core.has_unfinished())
        events["idle"] = time.perf_counter() - t0
        before = e.iterations
        await asyncio.sleep(0.3)
        events["idle iterations"] = e.iterations - before
        events["four short"] = time.perf_counter() - t0
        await asyncio.gather(*(stream(e, f"s{i}", [30 + i] * 4, greedy(12)) for i in range(4)))
        await asyncio.sleep(0.05)
        done.set()
        await hb
        return t0, beats

    t0, beats = asyncio.run(main())
    e.stop()
    return {"spans": [(a - t0, b - t0) for a, b in spans], "beats": beats, "events": events}


def worst_on_loop() -> tuple[float, float]:
    """The same four prefills stepped on the loop itself: the heartbeat waits for each forward.
    Returns (worst lateness, longest forward), in ms."""
    llm = LLM(SHIPPED, **SHAPE)

    async def main():
        done, beats = asyncio.Event(), []
        hb = asyncio.create_task(heartbeat(time.perf_counter(), done, beats))
        await asyncio.sleep(0.005)
        for i, p in enumerate(PROMPTS):
            llm.core.add_request(f"q{i}", p, greedy(24))
        longest = 0.0
        with torch.inference_mode():
            while llm.core.has_unfinished():
                t = time.perf_counter()
                llm.core.step()
                longest = max(longest, time.perf_counter() - t)
                await asyncio.sleep(0)
        done.set()
        await hb
        return max(b for _, b in beats), longest * 1e3

    return asyncio.run(main())


def main() -> None:
    torch.set_num_threads(1)
    run = run_threaded()
    loop_worst, loop_forward = worst_on_loop()
    spans, beats, ev = run["spans"], run["beats"], run["events"]
    end = max(b for _, b in spans) + 0.05

    fig = figure(width=12, height=5.8)[0]
    fig.clf()
    grid = fig.add_gridspec(2, 2, height_ratios=[1.0, 1.3], width_ratios=[2.4, 1.0],
                            hspace=0.12, wspace=0.25)
    top = fig.add_subplot(grid[0, 0])
    left = fig.add_subplot(grid[1, 0], sharex=top)
    right = fig.add_subplot(grid[:, 1])
    top.broken_barh([(a, b - a) for a, b in spans], (0.2, 0.6), facecolors=COLORS["compute"])
    for ax in (top, left):
        ax.axvspan(ev["idle"], ev["four short"], color=COLORS["muted"], zorder=0)
    top.text((ev["idle"] + ev["four short"]) / 2, 0.5,
             f"idle 0.3 s:\n{ev['idle iterations']} iterations", ha="center", va="center",
             fontsize=9, color=COLORS["ink"],
             bbox={"facecolor": COLORS["paper"], "edgecolor": "none", "pad": 2})
    for name, x in (("4 streams, 200-token prompts", ev["four streams"]),
                    ("consumer cancelled", ev["cancel"]), ("4 short streams", ev["four short"])):
        for ax in (top, left):
            ax.axvline(x, color=COLORS["highlight"], linewidth=1.2, linestyle="--")
        top.text(x + 0.006, 0.95, name, fontsize=8.5, va="bottom", color=COLORS["ink"])
    top.set_yticks([])
    top.set_ylim(0, 1.25)
    top.grid(visible=False)
    top.tick_params(labelbottom=False)
    top.set_ylabel("engine thread:\nforwards")
    top.set_title(f"One run: {len(spans)} forwards on the engine thread", fontsize=11,
                  loc="left")
    xs, ys = zip(*beats, strict=True)
    left.plot(xs, ys, color=COLORS["memory"], linewidth=0.9)
    left.set_ylabel("event loop: 1 ms heartbeat\nlateness (ms)")
    left.set_ylim(0, max(ys) * 1.15)
    left.set_xlim(0, end)
    left.set_xlabel("time since start (s)")

    thread_worst = max(ys)
    first_forward = max(b - a for a, b in spans) * 1e3
    bars = right.bar([0, 1], [thread_worst, loop_worst],
                     color=[COLORS["memory"], COLORS["waste"]], width=0.6)
    right.axhline(loop_forward, color=COLORS["reference"], linestyle="--", linewidth=1.0)
    right.text(1.35, loop_forward, f"longest forward\n{loop_forward:.0f} ms", fontsize=8.5,
               va="center", color=COLORS["reference"])
    for b, v in zip(bars, [thread_worst, loop_worst], strict=True):
        right.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f} ms", ha="center", va="bottom",
                   fontsize=9.5)
    right.set_xticks([0, 1], ["core on its\nown thread", "core on\nthe loop"])
    right.set_xlim(-0.5, 2.0)
    right.set_ylabel("worst heartbeat lateness (ms)")
    right.set_title("Worst lateness, 4 long prefills", fontsize=11, loc="left")
    right.grid(axis="x", visible=False)
    print(f"thread: worst lateness {thread_worst:.1f} ms, longest forward {first_forward:.0f} ms;"
          f" on the loop: {loop_worst:.1f} ms, longest forward {loop_forward:.0f} ms")

    fig.suptitle("Day 37: the async engine (nanoserve-tiny fp32, 64 blocks, 4 slots, one torch "
                 "thread, 2-core CPU)", fontsize=12.5, fontweight="bold", y=1.0)
    save(fig, __file__, "async-engine")


if __name__ == "__main__":
    main()

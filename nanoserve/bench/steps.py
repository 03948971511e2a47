"""Where an offline run's time goes: every engine step timed, grouped by what it computed.

Why this module exists: ``bench offline`` gives one number for a whole ragged workload, and a
profile of a few decode steps at full batch says nothing of the rest of the run. A run of 16
ragged requests at 8 rows is a few prompt-heavy steps (a chunk of prompts alone, or chunks
beside decodes in one packed forward) and a couple of hundred decode steps, many of them in the
ragged tail, where fewer than 8 rows still stream every weight. Which of those the time goes to
decides what is worth making faster: the prefill's GEMMs, the 8-row decode step, or the
one-to-three-row tail that only memory bandwidth can speed up. This command runs the same
workload as ``bench offline`` (``offline.workload_for``: the checkpoint's vocabulary, the
``max_model_len`` the prompts need) through the public ``LLM``, wraps its engine's ``step`` with a
timer, and prints, per step kind, the count, total seconds, milliseconds a step and tokens.
The counts depend only on the scheduler and the workload, so they are the same on every
machine; the times are one process on one machine, absolute, so quote them with it.

    python -m nanoserve.bench.steps --shape smollm2-135m --dtype float32 --threads 1
    python -m nanoserve.bench.steps --profile 12      # and the run's top ops by self CPU time
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from nanoserve.bench.workload import Workload
from nanoserve.config import DEFAULT_MODEL
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams


@dataclass
class Kind:
    """One kind of step: how many ran, their wall time, the tokens they computed."""

    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0


@dataclass
class Breakdown:
    """Every engine step of one ``generate`` call, by kind (``kind_of``)."""

    kinds: dict[str, Kind] = field(default_factory=dict)
    wall_s: float = 0.0
    output_tokens: int = 0

    def add(self, kind: str, seconds: float, tokens: int) -> None:
        k = self.kinds.setdefault(kind, Kind())
        k.steps, k.seconds, k.tokens = k.steps + 1, k.seconds + seconds, k.tokens + tokens

    @property
    def step_seconds(self) -> float:
        return sum(k.seconds for k in self.kinds.values())


def kind_of(prompt_tokens: int, decode_rows: int) -> str:
    """A step's kind: ``prefill`` (prompt chunks only), ``mixed`` (chunks and decodes in one
    step), or ``decode N`` (N rows, one token each)."""
    if prompt_tokens and decode_rows:
        return "mixed"
    if prompt_tokens:
        return "prefill"
    if decode_rows:
        return f"decode {decode_rows}"
    raise ValueError("a step with no prompt token and no decode row computed nothing")


def _order(kind: str) -> tuple[int, int]:
    if kind.startswith("decode "):
        return 2, int(kind.split()[1])
    return (0, 0) if kind == "prefill" else (1, 0)


@contextmanager
def timed_steps(llm: LLM, into: Callable[[str, float, int], None]) -> Iterator[None]:
    """Time each of ``llm``'s engine steps and report (kind, seconds, tokens) to ``into``;
    the engine's own ``step`` is back in place afterwards, whatever happened."""
    engine = llm.engine
    if "step" in vars(engine):
        raise RuntimeError("the engine's step is already wrapped")
    inner = engine.step

    def step(out):
        prompt = sum(c.n for c in out.chunks)
        t = time.perf_counter()
        try:
            return inner(out)
        finally:
            into(kind_of(prompt, len(out.decode)), time.perf_counter() - t,
                 prompt + len(out.decode))

    engine.step = step
    try:
        yield
    finally:
        del engine.step


def run(llm: LLM, wl: Workload) -> Breakdown:
    """One ``generate`` over the workload, greedy with EOS ignored, every step timed."""
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
              for m in wl.max_tokens]
    b = Breakdown()
    with timed_steps(llm, b.add):
        t = time.perf_counter()
        outs = llm.generate(wl.prompts, params)
        b.wall_s = time.perf_counter() - t
    b.output_tokens = sum(len(o.token_ids) for o in outs)
    if b.output_tokens != sum(wl.max_tokens):
        raise RuntimeError(f"{b.output_tokens} tokens came back, {sum(wl.max_tokens)} asked for")
    return b


def report(b: Breakdown) -> str:
    lines = [f"{b.output_tokens} tokens in {b.wall_s:.2f} s = {b.output_tokens / b.wall_s:.1f} "
             f"tok/s; {b.step_seconds:.2f} s in {sum(k.steps for k in b.kinds.values())} "
             f"engine steps", f"{'kind':<10} {'steps':>6} {'seconds':>8} {'share':>6} "
                             f"{'ms/step':>8} {'tokens':>7}"]
    for name in sorted(b.kinds, key=_order):
        k = b.kinds[name]
        lines.append(f"{name:<10} {k.steps:>6} {k.seconds:>8.2f} "
                     f"{k.seconds / b.wall_s:>6.1%} {1e3 * k.seconds / k.steps:>8.1f} "
                     f"{k.tokens:>7}")
    return "\n".join(lines)


def main(argv=None) -> None:
    from nanoserve.bench.offline import workload_for
    from nanoserve.bench.shapes import SHAPES, shape_checkpoint

    p = argparse.ArgumentParser(prog="python -m nanoserve.bench.steps")
    p.add_argument("--shape", choices=["tiny", *SHAPES], default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--batch", type=int, default=8, help="max_num_seqs")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2, help="timed rounds after one warm-up")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="profile the last round and list its top N ops by self CPU time")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    model = DEFAULT_MODEL if a.shape == "tiny" else shape_checkpoint(a.shape)
    wl, max_model_len = workload_for(model, a.requests)
    llm = LLM(model, dtype=a.dtype, skip_tokenizer_init=True, max_num_seqs=a.batch,
              max_model_len=max_model_len)
    print(f"{a.shape}, {llm.dtype}, {a.requests} requests (prompts 16-192, outputs 16-128), "
          f"{a.batch} rows, torch {torch.get_num_threads()} thread(s), CPUs "
          f"{llm.binding.cpus or 'not pinned'}; {llm.kernels_reason}")
    run(llm, wl.head(a.batch, max_tokens=8))  # the warm-up bench offline runs
    for r in range(a.rounds):
        if a.profile and r == a.rounds - 1:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                b = run(llm, wl)
            print(f"round {r} (profiled): " + report(b))
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.profile,
                                            max_name_column_width=40))
        else:
            print(f"round {r}: " + report(run(llm, wl)))


if __name__ == "__main__":
    main()

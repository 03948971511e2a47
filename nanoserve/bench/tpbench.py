"""``nanoserve bench tp``: what tensor parallelism costs and buys on this machine (Day 66).

Why this module exists: splitting a model over ranks trades compute for communication, and
whether the trade pays depends on the machine, so it is measured, not argued. Two arms on the
same checkpoint, the same seeded workload and the same cores, in interleaved rounds:

- ``1 rank x C threads``: one process computing on all C usable cores;
- ``R ranks x C/R threads``: ``tensor_parallel_size=R``, each rank pinned to its own share.

It also takes one tensor-parallel decode step apart: the bytes each collective moved (per layer
and per step, from ``CommStats``, the tensors' own sizes), and rank 0's step time split into
time inside a collective (waiting for the slower rank included) and the rest, its compute.

    nanoserve bench tp --shape smollm2-135m --dtype float32 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from nanoserve.bench.hardware import hardware
from nanoserve.bench.shapes import SHAPES, shape_checkpoint
from nanoserve.bench.workload import make_workload
from nanoserve.config import DEFAULT_MODEL


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", choices=["tiny", *SHAPES], default="tiny")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--batch", type=int, default=8, help="max_num_seqs of both arms")
    p.add_argument("--decode-steps", type=int, default=32,
                   help="decode steps of the step split, at --batch rows")
    p.add_argument("--json", action="store_true")
    p.add_argument("--record", default=None, metavar="PATH",
                   help="also write the report as a chapter's results file")


def _llm(model: Path, dtype: str, tp: int, batch: int, max_len: int):
    from nanoserve.llm import LLM

    return LLM(model, dtype=dtype, tensor_parallel_size=tp, max_num_seqs=batch,
               max_model_len=max_len, skip_tokenizer_init=True)


def throughput(llm, wl) -> tuple[float, list[list[int]]]:
    """Useful tokens per second over one run of the workload, and the tokens."""
    from nanoserve.sampling.params import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl.max_tokens]
    t0 = time.perf_counter()
    outs = llm.generate(wl.prompts, params)
    return wl.useful_tokens / (time.perf_counter() - t0), [o.token_ids for o in outs]


def step_split(llm, rows: int, steps: int, prompt_len: int = 32) -> dict:
    """``steps`` decode steps of ``rows`` rows on rank 0: wall time, time inside collectives,
    and what each collective moved, per step and per layer."""
    e, comm = llm.engine, llm.engine.executor.comm
    layers = llm.config.num_hidden_layers
    ids = [[2 + (7 * r + i) % 97 for i in range(prompt_len)] for r in range(rows)]
    with torch.inference_mode(), _pinned(llm):
        for r in range(rows):
            e.grant(r, prompt_len + steps + 1)
        try:
            logits = e.prefill(list(range(rows)), ids)
            comm.stats.reset()
            t0 = time.perf_counter()
            for _ in range(steps):
                logits = e.decode(list(range(rows)), logits.argmax(-1).tolist())
            wall = time.perf_counter() - t0
        finally:
            for r in range(rows):
                e.release(r)
    s = comm.stats
    per_step = {k: s.nbytes[k] // steps for k in s.nbytes}
    model_reduces = s.calls.get("all_reduce", 0) // steps
    return {"rows": rows, "steps": steps, "layers": layers,
            "step_ms": 1e3 * wall / steps,
            "comm_ms": 1e3 * s.total_seconds() / steps,
            "comm_share": s.total_seconds() / wall,
            "calls_per_step": {k: v // steps for k, v in s.calls.items()},
            "bytes_per_step": per_step,
            "all_reduces_per_step": model_reduces,
            "all_reduce_bytes_per_layer": (per_step.get("all_reduce", 0)
                                           * (model_reduces - 1) // model_reduces // layers
                                           if model_reduces else 0)}


def _pinned(llm):
    from nanoserve.cpu.threads import pinned

    return pinned(llm.binding)


def run(model: Path, dtype: str, ranks: int, rounds: int, requests: int, batch: int,
        decode_steps: int, log=lambda m: None) -> dict:
    cfg = json.loads((model / "config.json").read_text())
    wl = make_workload(requests, (16, 192), (16, 128), cfg["vocab_size"], seed=0)
    max_len = min(max(len(p) for p in wl.prompts) + max(wl.max_tokens),
                  cfg["max_position_embeddings"])
    cores = len(os.sched_getaffinity(0))
    arms = {f"1 rank x {cores} threads": 1, f"{ranks} ranks x {max(1, cores // ranks)} "
            f"thread{'s' if cores // ranks > 1 else ''}": ranks}
    llms = {name: _llm(model, dtype, tp, batch, max_len) for name, tp in arms.items()}
    try:
        tokens, best = {}, {}
        for name, llm in llms.items():  # warm-up, and the tokens each arm gives
            log(f"warm-up: {name}")
            _, tokens[name] = throughput(llm, wl)
        for i in range(rounds):
            for name in (list(llms) if i % 2 == 0 else list(llms)[::-1]):
                tps, _ = throughput(llms[name], wl)
                log(f"round {i + 1}: {name}: {tps:.1f} tok/s")
                best[name] = max(best.get(name, 0.0), tps)
        one, many = list(arms)
        split = step_split(llms[many], batch, decode_steps)
    finally:
        for llm in llms.values():
            llm.shutdown()
    return {"hardware": hardware("cpu"), "model": str(model), "dtype": dtype,
            "workload": {"requests": requests, "useful_tokens": wl.useful_tokens,
                         "batch": batch}, "rounds": rounds,
            "tokens_per_s": best, "ratio": best[many] / best[one],
            "same_tokens": tokens[one] == tokens[many], "step_split": split}


def main(args: argparse.Namespace) -> int:
    model = DEFAULT_MODEL if args.shape == "tiny" else shape_checkpoint(args.shape)
    t0 = time.perf_counter()
    try:
        report = run(model, args.dtype, args.ranks, args.rounds, args.requests, args.batch,
                     args.decode_steps,
                     log=lambda m: print(f"[{time.perf_counter() - t0:6.1f}s] bench tp: {m}",
                                         file=sys.stderr, flush=True))
    except ValueError as e:
        print(f"nanoserve bench tp: error: {e}", file=sys.stderr)
        return 2
    report["shape"] = args.shape
    hw, split = report["hardware"], report["step_split"]
    print(f"{hw.get('cpu', 'cpu')}, {args.dtype}, {args.shape}, {args.requests} requests, "
          f"batch {args.batch}, best of {args.rounds} interleaved rounds", file=sys.stderr)
    for name, tps in report["tokens_per_s"].items():
        print(f"  {name:>24}: {tps:8.1f} tok/s", file=sys.stderr)
    print(f"  ratio (ranks / one rank): {report['ratio']:.2f}x; same tokens: "
          f"{report['same_tokens']}", file=sys.stderr)
    print(f"  decode step at {split['rows']} rows: {split['step_ms']:.2f} ms, of which "
          f"{split['comm_ms']:.2f} ms in collectives ({split['comm_share']:.0%}); "
          f"{split['all_reduce_bytes_per_layer']} B all-reduced per layer, "
          f"{split['bytes_per_step']} per step", file=sys.stderr)
    if args.json:
        print(json.dumps(report))
    if args.record:
        Path(args.record).write_text(json.dumps(as_record(report), indent=1) + "\n")
    # float32 must give the same tokens; bf16 rounds the partial sums differently, so greedy
    # ties may break the other way (said, not failed)
    return 0 if report["same_tokens"] or args.dtype != "float32" else 1


def as_record(report: dict) -> dict:
    """The report as a chapter's ``recorded`` results file: machine, date, command, values."""
    import datetime
    import platform

    hw, split = report["hardware"], report["step_split"]
    (one, one_tps), (many, many_tps) = report["tokens_per_s"].items()
    values = {"tokens_per_s_one_rank": round(one_tps, 1), "tokens_per_s_ranks": round(many_tps, 1),
              "ratio": round(report["ratio"], 3), "arms": [one, many],
              "same_tokens": report["same_tokens"], "comm_share": round(split["comm_share"], 3),
              "step_ms": round(split["step_ms"], 3), "comm_ms": round(split["comm_ms"], 3)}
    return {"machine": f"{platform.machine()} {hw['cpu']}, {hw['cores']} cores, no GPU",
            "date": datetime.date.today().isoformat(),
            "command": "nanoserve bench tp " + " ".join(sys.argv[1:]).split("bench tp ")[-1],
            "values": values, "report": report}

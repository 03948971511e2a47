"""``nanoserve bench spec``: speculative decoding against none, per issue 41's targets.

Why this module exists: speculation pays only where proposals are accepted and verifying them
costs little more than a plain step, and both depend on the text and the machine. This command
measures, in one run, greedy, at each ``--threads`` count (an arm's threads pinned one a CPU):

1. ``copy``: the shipped model (``--dtype``) on copy-heavy prompts (``spec_workload``: a passage
   of its training text, then its opening again; the held-out split's passages reported apart),
   speculation off against ngram (``--k``, each ``--lookups`` MIN:MAX: vLLM's default 5:5 and a
   shorter minimum), one request at a time and ``--batch`` at once. Targets: >= 2x at one
   request, >= 1.3x at 8.
2. ``norepeat``: prompts of distinct random ids, which give lookup nothing; target >= 0.95x.
3. ``shape``: random weights in ``--shape``'s published config (``--shape-layers`` of its
   layers), bf16, one request, prompts forced to hold their own continuation
   (``spec_workload.forced_repeat``); the verify step's cost in plain steps for k in
   ``--step-ks`` (``spec_arms.step_costs``) and the speed-up it predicts at the acceptance
   measured.
4. ``draft``: the shipped model verifying a draft of its first ``--draft-layers`` layers, and
   itself as its own draft; measured speed-up against ``(1 - a^(k+1)) / ((1 - a)(1 + k c))``
   (``a`` the acceptance rate, ``c`` a draft step's cost over a target step's, both measured).
   Skipped, saying so, where the draft_model proposer is not built.
5. ``vllm`` (``--vllm``): vLLM's CPU build (``--vllm-venv``) with the same configurations on
   the same checkpoint and copy-heavy prompts, one request at a time; nanoserve's speculative
   decode tokens/s over vLLM's (target >= 1.5x), both acceptance lengths beside it.

How each figure is measured is in ``spec_arms`` (nanoserve) and ``vllm_spec`` (vLLM); the
report's ``figures`` line repeats it. Tables go to stderr, the report to ``--out`` (JSON, every
row), and with ``--json`` to stdout. ``--quick`` is a seconds-long run for the tests.

    nanoserve bench spec                               # sections 1-4, 1 and 2 threads
    nanoserve bench spec --vllm --vllm-venv /abs/.venv-vllm --out build/bench/spec.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from nanoserve.bench.adapters import DEFAULT_VLLM_VENV
from nanoserve.bench.shapes import ROOT
from nanoserve.config import DEFAULT_MODEL

SECTIONS = ("copy", "norepeat", "shape", "draft")
FIGURES = ("decode tok/s: output tokens after each request's first over the time from first "
           "token to last (one request: summed over requests; a batch: earliest first to "
           "latest last); e2e tok/s: all output tokens over generate's wall time; best of the "
           "interleaved rounds. MAL: mean acceptance length, 1 + accepted / drafts; accept: "
           "accepted / proposed; drafts: verify steps that checked proposals, summed over "
           "requests (a round's). x off: over speculation off, same row otherwise.")
QUICK = {"threads": "1", "dtype": "float32", "requests": 2, "batch": 2, "max_tokens": 16,
         "passage_len": 64, "reopen": 8, "rounds": 1, "lookups": "2:5", "step_reps": 3,
         "step_ks": "1,4"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, from {','.join(SECTIONS)} (vllm: --vllm)")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--dtype", default="float32", help="the shipped model's dtypes, comma-"
                                                      "separated (float32, bfloat16)")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--lookups", default="5:5,2:5",
                   help="ngram arms: prompt_lookup_min:prompt_lookup_max, comma-separated")
    p.add_argument("--requests", type=int, default=8, help="prompts per workload")
    p.add_argument("--batch", type=int, default=8, help="requests at once in the batch rows")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--passage-len", type=int, default=192)
    p.add_argument("--reopen", type=int, default=24, help="the opening repeated after it")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--shape-layers", type=int, default=30, help="its first N layers")
    p.add_argument("--shape-requests", type=int, default=2)
    p.add_argument("--shape-prompt-len", type=int, default=128)
    p.add_argument("--shape-m", type=int, default=32,
                   help="greedy tokens of its own in each forced-repeat prompt")
    p.add_argument("--step-ks", default="1,2,3,4,5,6,7,8")
    p.add_argument("--step-reps", type=int, default=30)
    p.add_argument("--draft-layers", default="1", help="truncated drafts' layer counts")
    p.add_argument("--vllm", action="store_true", help="section 5: vLLM's CPU build")
    p.add_argument("--vllm-venv", default=str(DEFAULT_VLLM_VENV))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="seconds: the tests' run ("
                   + ", ".join(f"{k}={v}" for k, v in QUICK.items()) + ", copy only)")
    p.add_argument("--out", default=None, help="JSON report (default build/bench/spec.json)")
    p.add_argument("--json", action="store_true", help="print the report on stdout too")


def _ints(text: str, what: str) -> list[int]:
    try:
        got = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} {text!r}: comma-separated integers") from None
    if not got or min(got) < 1:
        raise ValueError(f"{what} {text!r}: integers >= 1")
    return got


def parse(args: argparse.Namespace) -> argparse.Namespace:
    """Check and normalize the arguments (``--quick`` first); a ValueError names the flag."""
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
        if args.sections == ",".join(SECTIONS):
            args.sections = "copy"
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if set(args.sections) - set(SECTIONS):
        raise ValueError(f"--sections {args.sections}: choose from {SECTIONS}")
    args.threads = _ints(str(args.threads), "--threads")
    if max(args.threads) > len(os.sched_getaffinity(0)):
        raise ValueError(f"--threads {args.threads}: this process may use "
                         f"{len(os.sched_getaffinity(0))} CPUs")
    args.dtype = [d.strip() for d in args.dtype.split(",") if d.strip()]
    if set(args.dtype) - {"float32", "bfloat16"}:
        raise ValueError(f"--dtype {args.dtype}: float32 and/or bfloat16")
    try:
        args.lookups = [tuple(int(x) for x in pair.split(":"))
                        for pair in args.lookups.split(",")]
    except ValueError:
        raise ValueError(f"--lookups {args.lookups!r}: MIN:MAX pairs, comma-separated") \
            from None
    if any(len(p) != 2 or not 1 <= p[0] <= p[1] for p in args.lookups):
        raise ValueError(f"--lookups {args.lookups}: MIN:MAX with 1 <= MIN <= MAX")
    args.vllm_venv = str(Path(args.vllm_venv).resolve())  # its runner starts in another cwd
    args.step_ks = _ints(str(args.step_ks), "--step-ks")
    args.draft_layers = _ints(str(args.draft_layers), "--draft-layers")
    for flag in ("k", "requests", "batch", "max_tokens", "rounds", "step_reps",
                 "passage_len", "reopen"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1")
    return args


def run(args: argparse.Namespace, log) -> dict:
    """Every section asked for; the report (rows not yet summarized)."""
    from nanoserve.bench.hardware import hardware
    from nanoserve.bench.spec_sections import (
        draft_section,
        ngram_spec,
        run_grid,
        shape_section,
    )
    from nanoserve.bench.spec_workload import copy_heavy, no_repeat

    specs = [ngram_spec(args.k, lo, hi) for lo, hi in args.lookups]
    wl = {split: copy_heavy(split, args.requests, args.passage_len, args.reopen,
                            args.max_tokens, args.seed) for split in ("train", "val")}
    wl["norepeat"] = no_repeat(args.requests, args.passage_len + args.reopen,
                               max_tokens=args.max_tokens, seed=args.seed)
    batches = [1] if args.batch == 1 else [1, args.batch]
    report = {"hardware": hardware("cpu"), "threads": args.threads, "dtypes": args.dtype,
              "model": str(DEFAULT_MODEL), "k": args.k, "lookups": args.lookups,
              "rounds": args.rounds, "figures": FIGURES, "sections": args.sections,
              "workloads": {w.name: w.describe() for w in wl.values()},
              "rows": [], "step_costs": [], "notes": {}}
    name = DEFAULT_MODEL.name
    for t in args.threads:
        for dtype in args.dtype:
            if "copy" in args.sections:
                report["rows"] += run_grid("copy", DEFAULT_MODEL, name, dtype, t,
                                           [None, *specs],
                                           [(wl[s], b) for s in ("train", "val")
                                            for b in batches], args.rounds, log)
            if "norepeat" in args.sections:
                report["rows"] += run_grid("norepeat", DEFAULT_MODEL, name, dtype, t,
                                           [None, *specs], [(wl["norepeat"], b)
                                                            for b in batches],
                                           args.rounds, log)
        if "shape" in args.sections:
            got = shape_section(args, t, specs, log)
            report["rows"] += got["rows"]
            report["step_costs"].append(got["step_costs"])
            report["workloads"]["forced-repeat"] = got["workload"]
        if "draft" in args.sections:
            got = draft_section(args, t, args.dtype[0], wl["train"], DEFAULT_MODEL, log)
            report["rows"] += got["rows"]
            report["notes"]["draft"] = got["notes"]
    if args.vllm:
        from nanoserve.bench.vllm_spec import vllm_spec_arm

        for spec in [None, *specs]:
            from nanoserve.bench.spec_sections import arm_name

            row = vllm_spec_arm(arm_name(spec), Path(args.vllm_venv), DEFAULT_MODEL,
                                args.dtype[0], spec, wl["train"], args.rounds, 512, log)
            row.update(section="vllm", model=name, dtype=args.dtype[0], workload="copy-heavy-"
                       "train", batch=1)
            row.setdefault("threads", None)
            report["rows"].append(row)
    return report


def main(args: argparse.Namespace) -> int:
    from nanoserve.bench.spec_report import print_report, summarize

    try:
        args = parse(args)
    except ValueError as e:
        print(f"nanoserve bench spec: error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] bench spec: {msg}", file=sys.stderr,
              flush=True)

    report = run(args, log)
    summarize(report)
    report["hardware"]["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out) if args.out else ROOT / "build" / "bench" / "spec.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print_report(report)
    log(f"report in {out}")
    if args.json:
        print(json.dumps(report))
    return 0

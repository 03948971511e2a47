"""``nanoserve bench serve-pair``: nanoserve's server and a peer's, both up, measured in turns.

Why this module exists: ``bench serve`` measures one server. Run it against vLLM's server and
then against ours and the two tables come minutes apart, on a shared machine whose speed drifts
in between: the last closing note found such sequential runs unfair. Here both servers start
first and stay up. Each round sends the same seeded load (one seed per round) to one and then
the other at every rate, and the order flips from round to round, so drift lands on both arms
alike. Every metric is reported per arm as the median over rounds, and every ratio is taken
within a round (nanoserve over the peer) before its median is taken.

The peer is vLLM's OpenAI server from ``.venv-vllm`` (``--peer vllm``, what ``make bench-peers``
runs) or a second ``nanoserve serve`` (``--peer nanoserve``: the control, whose ratios should sit
near 1, and what the tests run where vLLM is absent).

    nanoserve bench serve-pair --model nanoserve/checkpoints/nanoserve-tiny --rates 4,inf \\
        --rounds 3 --requests 32 --max-concurrency 8 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys

from nanoserve.bench.serve import run_bench

KEYS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
ARMS = ("nanoserve", "peer")


def _start(stack: contextlib.ExitStack, arm: str, peer: str, model, nanoserve_args, peer_args,
           venv, timeout_s: float) -> str:
    from nanoserve.bench.local_server import local_server
    from nanoserve.bench.vllm_server import vllm_server

    if arm == "peer" and peer == "vllm":
        return stack.enter_context(vllm_server(model, tuple(peer_args), venv)).url
    args = nanoserve_args if arm == "nanoserve" else peer_args
    return stack.enter_context(local_server(model, timeout_s=timeout_s,
                                            extra_args=tuple(args))).url


def run_pair(model, rates, rounds: int = 3, peer: str = "vllm", nanoserve_args=(),
             peer_args=(), venv=None, seed: int = 0, server_timeout_s: float = 600.0,
             log=None, **bench) -> dict:
    """``{"rounds": [{rate: {arm: metrics}}], "summary": {rate: ...}}``; ``bench`` holds
    ``run_bench``'s load keywords (requests, input_len, max_concurrency, dataset_name, ...)."""
    if peer not in ("vllm", "nanoserve"):
        raise ValueError(f"--peer {peer!r}: choose vllm or nanoserve")
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    log = log or (lambda message: None)
    per_round: list[dict] = []
    with contextlib.ExitStack() as stack:
        urls = {arm: _start(stack, arm, peer, model, nanoserve_args, peer_args, venv,
                            server_timeout_s) for arm in ARMS}
        for r in range(rounds):
            order = ARMS if r % 2 == 0 else ARMS[::-1]
            out: dict = {}
            for rate in rates:
                for arm in order:
                    log(f"round {r + 1}/{rounds}, rate {rate}, {arm}")
                    (res,) = run_bench(urls[arm], [rate], seed=seed + r, model=model, **bench)
                    out.setdefault(str(rate), {})[arm] = res
            per_round.append(out)
    return {"peer": peer, "rounds": per_round, "summary": summarize(per_round)}


def summarize(per_round: list[dict]) -> dict:
    """Per rate: each arm's median over rounds, and the median of the per-round ratios."""
    summary = {}
    for rate in per_round[0]:
        runs = [rnd[rate] for rnd in per_round]
        row = {"failed": {arm: sum(x[arm]["failed"] for x in runs) for arm in ARMS}}
        for key in KEYS:
            row[key] = {arm: statistics.median(x[arm][key] for x in runs) for arm in ARMS}
            ratios = [x["nanoserve"][key] / x["peer"][key] for x in runs if x["peer"][key]]
            row[key]["nanoserve_over_peer"] = statistics.median(ratios) if ratios else math.nan
        summary[rate] = row
    return summary


def print_summary(report: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption="medians over rounds; ratios taken within each round, "
                  "then their median (throughput: higher is better; TTFT, ITL: lower)",
                  caption_justify="left")
    for col in ("rate", "metric", "nanoserve", report["peer"], "nanoserve / peer"):
        table.add_column(col, justify="left" if col in ("rate", "metric") else "right")
    for rate, row in report["summary"].items():
        for key in KEYS:
            v = row[key]
            table.add_row(rate, key, f"{v['nanoserve']:.2f}", f"{v['peer']:.2f}",
                          f"{v['nanoserve_over_peer']:.2f}x")
        table.add_row(rate, "failed", str(row["failed"]["nanoserve"]), str(row["failed"]["peer"]),
                      "")
    Console(stderr=True).print(table)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from nanoserve.bench.serve_cli import rates
    from nanoserve.bench.workload import DATASETS

    p.add_argument("--model", required=True, help="the checkpoint both servers load")
    p.add_argument("--peer", choices=("vllm", "nanoserve"), default="vllm")
    p.add_argument("--rates", type=rates, default=[1.0, 4.0, math.inf])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=32, help="requests per rate and round")
    p.add_argument("--dataset-name", choices=DATASETS, default="random")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0, help="round r uses seed + r, on both arms")
    p.add_argument("--nanoserve-args", default="--dtype float32 --max-num-seqs 8",
                   help="nanoserve serve's flags, one string")
    p.add_argument("--peer-args", default="--dtype float32 --max-num-seqs 8",
                   help="the peer server's flags, one string (vLLM's own for --peer vllm)")
    p.add_argument("--vllm-venv", default=None)
    p.add_argument("--max-duration", type=float, default=600.0,
                   help="seconds per rate before unfinished requests count as failed")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    import time

    t0 = time.perf_counter()
    try:
        report = run_pair(
            args.model, args.rates, args.rounds, args.peer, args.nanoserve_args.split(),
            args.peer_args.split(), args.vllm_venv, args.seed, requests=args.requests,
            dataset_name=args.dataset_name, input_len=args.input_len,
            output_len=args.output_len, max_concurrency=args.max_concurrency,
            max_duration_s=args.max_duration,
            log=lambda m: print(f"[{time.perf_counter() - t0:7.1f}s] serve-pair: {m}",
                                file=sys.stderr, flush=True))
    except (ValueError, RuntimeError) as e:
        print(f"nanoserve bench serve-pair: error: {e}", file=sys.stderr)
        return 2
    print_summary(report, f"nanoserve bench serve-pair: {args.model}, nanoserve "
                          f"[{args.nanoserve_args}] vs {args.peer} [{args.peer_args}], "
                          f"{args.requests} {args.dataset_name} requests per rate, "
                          f"{args.rounds} rounds in alternating order")
    if args.json:
        print(json.dumps(report))
    failed = sum(sum(row["failed"].values()) for row in report["summary"].values())
    return 0 if failed == 0 else 1

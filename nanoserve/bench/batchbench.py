"""batchbench: the engine on a workload, with preemption in the measurement.

Why this module exists: a run that recomputes half its tokens can look like a run that scheduled
well if nobody counts the recompute. batchbench runs ``LLM.generate`` on a seeded workload and
reports, beside throughput: preemptions per request, the recompute bill as a share of all the
token positions the model computed, and the latency of requests that were preempted against
those that ran straight through.

    nanoserve bench batch --requests 12 --num-kv-blocks 24 --block-size 4 --max-num-seqs 8 --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams


def workload(requests: int, seed: int, prompt_lens: tuple[int, int], gen_lens: tuple[int, int],
             vocab: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, vocab) for _ in range(rng.randint(*prompt_lens))]
               for _ in range(requests)]
    return prompts, [rng.randint(*gen_lens) for _ in range(requests)]


def run(llm: LLM, prompts: list[list[int]], max_tokens: list[int]) -> dict:
    """Greedy, EOS ignored, so every request produces exactly its max_tokens."""
    before = (llm.stats.tokens_computed, llm.stats.preemptions, llm.stats.recomputed_tokens)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
                                  for m in max_tokens])
    wall = time.perf_counter() - t0
    computed = llm.stats.tokens_computed - before[0]
    recomputed = llm.stats.recomputed_tokens - before[2]
    latency = {o.request_id: o.metrics.finished_time - o.metrics.arrival_time for o in outs}
    hit = [o for o in outs if o.num_preemptions]
    straight = [o for o in outs if not o.num_preemptions]

    def mean_latency(group):
        return round(statistics.mean(latency[o.request_id] for o in group), 4) if group else None

    generated = sum(len(o.token_ids) for o in outs)
    return {
        "requests": len(outs), "generated_tokens": generated, "wall_s": round(wall, 3),
        "tokens_per_s": round(generated / wall, 1),
        "preemptions": llm.stats.preemptions - before[1],
        "preemptions_per_request": [o.num_preemptions for o in outs],
        "preempted_requests": len(hit),
        "recomputed_tokens": recomputed, "tokens_computed": computed,
        "recompute_share": round(recomputed / computed, 4),
        "latency_preempted_s": mean_latency(hit), "latency_straight_s": mean_latency(straight),
        "latencies_s": [round(latency[o.request_id], 4) for o in outs],
        "token_ids": [o.token_ids for o in outs],
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-lens", default="4,24", help="min,max prompt tokens")
    p.add_argument("--gen-lens", default="8,40", help="min,max generated tokens")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--allocation", default="incremental")
    p.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    try:
        llm = LLM(args.model, dtype="float32", block_size=args.block_size,
                  num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_num_seqs,
                  allocation=args.allocation)
        lo_p, hi_p = (int(x) for x in args.prompt_lens.split(","))
        lo_g, hi_g = (int(x) for x in args.gen_lens.split(","))
        prompts, gens = workload(args.requests, args.seed, (lo_p, hi_p), (lo_g, hi_g),
                                 llm.config.vocab_size)
        result = run(llm, prompts, gens)
    except ValueError as e:
        print(f"nanoserve bench batch: error: {e}")
        return 2
    result.pop("token_ids")
    result.pop("latencies_s")
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0

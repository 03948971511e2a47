"""The stress test: many sequences through a pool small enough to preempt constantly.

Why this module exists: preemption, recompute and aborts each work in a unit test; the question
is whether they still work when they happen all the time, interleaved. A seeded workload of
random prompt and output lengths runs through a cramped engine while random requests are aborted
mid-flight, and three things are checked: every request's tokens equal a roomy engine's (an
aborted request's tokens are a prefix of them), the scheduler's invariants hold before every
iteration, and the pool is full again after the drain.

    nanoserve bench stress --requests 200 --num-kv-blocks 20 --abort-rate 0.05 --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from nanoserve.bench.batchbench import workload
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams


def run_stress(model=None, requests: int = 40, seed: int = 0, num_kv_blocks: int = 16,
               block_size: int = 4, max_num_seqs: int = 8, abort_rate: float = 0.05,
               prompt_lens: tuple[int, int] = (2, 20), gen_lens: tuple[int, int] = (1, 40)
               ) -> dict:
    kw = dict(dtype="float32", block_size=block_size, max_num_seqs=max_num_seqs,
              skip_tokenizer_init=True)  # token ids in, token ids out
    roomy, cramped = LLM(model, **kw), LLM(model, num_kv_blocks=num_kv_blocks, **kw)
    prompts, gens = workload(requests, seed, prompt_lens, gen_lens, cramped.config.vocab_size)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in gens]
    t0 = time.perf_counter()
    reqs, _ = cramped.make_requests(prompts, params)  # the door check first: fail before work
    reference = [o.token_ids for o in roomy.generate(prompts, params)]
    rng = random.Random(seed + 1)
    checks = aborted = 0
    core, before = cramped.core, cramped.core.snapshot()
    with torch.inference_mode():  # the core's public loop, with an abort and a check each step
        for r in reqs:
            core.add(r)
        while core.has_unfinished():
            core.check_invariants()
            checks += 1
            live = [r for r in reqs if not r.is_finished]
            if live and rng.random() < abort_rate:
                core.abort_request(rng.choice(live).request_id)
                aborted += 1
            core.step()
    core.check_drained()
    after = core.snapshot()
    mismatched = [r.request_id for r, ref in zip(reqs, reference, strict=True)
                  if (r.output_token_ids != ref if r.finish_reason != "abort"
                      else r.output_token_ids != ref[:len(r.output_token_ids)])]
    return {
        "requests": requests, "seed": seed, "num_kv_blocks": num_kv_blocks,
        "block_size": block_size, "max_num_seqs": max_num_seqs,
        "iterations": after.iterations - before.iterations, "invariant_checks": checks,
        "preemptions": after.num_preemptions - before.num_preemptions,
        "recomputed_tokens": after.recomputed_tokens - before.recomputed_tokens,
        "aborted": aborted, "mismatched_requests": mismatched,
        "pool_full_after_drain": after.num_free_blocks == after.num_blocks,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--num-kv-blocks", type=int, default=20)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--abort-rate", type=float, default=0.05)


def main(args: argparse.Namespace) -> int:
    try:
        out = run_stress(args.model, args.requests, args.seed, args.num_kv_blocks,
                         args.block_size, args.max_num_seqs, args.abort_rate)
    except ValueError as e:
        print(f"nanoserve bench stress: error: {e}")
        return 2
    print(json.dumps(out))
    ok = not out["mismatched_requests"] and out["pool_full_after_drain"] and out["preemptions"]
    return 0 if ok else 1

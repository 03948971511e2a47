"""What a sliding window saves the KV pool (Day 70): peak blocks held by one long generation.

Why this module exists: when every layer of a model attends through a window of ``w`` tokens,
a block whose last position is at least ``w`` behind the next query is never read again, and
the KV manager gives it back to the pool while the request runs
(``KVCacheManager.free_out_of_window``). This measures what that is worth, as a count, not a
time: one request (a 32-token prompt, 480 greedy tokens, blocks of 16, a window of 64 by
default) on a small random ``MistralForCausalLM`` that transformers writes, run twice on the
same weights, once with the blocks behind the window given back and once with every block kept
(``EngineCore.keep_window_blocks``), reading the pool after every step. The two texts must be
identical: giving a block back changes where nothing is read.

What to expect: without freeing the request ends holding ceil(512 / 16) = 32 blocks; with it,
the blocks a query at position i can see are those from (i - w + 1) // 16 to i // 16, at most
ceil((w - 1) / 16) + 1 = 5 for a window of 64, whatever the length. The pool also keeps one
block, the null block every placeholder names, out of every request's reach.

    python -m nanoserve.bench.window_pool          # prints the two runs as JSON
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from nanoserve.config import EngineConfig
from nanoserve.loader import load_core
from nanoserve.sampling.params import SamplingParams
from nanoserve.testing import write_hf_checkpoint


def write_checkpoint(path: str | Path, window: int, max_len: int, seed: int = 0) -> Path:
    """A random 2-layer ``MistralForCausalLM`` (8 query heads, 2 KV heads, hidden 64)."""
    return write_hf_checkpoint(path, "gqa", seed=seed, family="mistral", sliding_window=window,
                               max_position_embeddings=max_len)


def run_one(path: Path, prompt: list[int], max_tokens: int, block_size: int, free: bool,
            **options) -> dict:
    """One request to the end; the peak of blocks held after each step, and its tokens."""
    core = load_core(EngineConfig(model=path, dtype="float32", skip_tokenizer_init=True,
                                  kernels=False, block_size=block_size, max_num_seqs=2,
                                  max_model_len=len(prompt) + max_tokens, **options))
    if not free:
        core.keep_window_blocks()
    core.add_request("long", prompt, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                     ignore_eos=True))
    tokens, peak, steps = [], 0, 0
    with torch.inference_mode():
        while core.has_unfinished():
            for d in core.step():
                tokens += d.new_token_ids
            snap = core.snapshot()
            peak = max(peak, snap.num_blocks - snap.num_free_blocks)
            steps += 1
    core.release_finished()
    core.check_drained()
    kv = core.scheduler.kv_cache_manager
    return {"peak_blocks": peak, "usable_blocks": kv.num_blocks,
            "blocks_given_back": kv.window_freed, "steps": steps, "tokens": tokens}


def measure(prompt_len: int = 32, max_tokens: int = 480, block_size: int = 16,
            window: int = 64, attention: str = "reference", seed: int = 0,
            path: str | Path | None = None, **options) -> dict:
    """Both runs on one checkpoint (written to a temporary folder unless ``path`` names one)."""
    total = prompt_len + max_tokens
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, 255, (prompt_len,), generator=g).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(path) if path is not None else write_checkpoint(tmp, window, total, seed)
        freeing = run_one(ckpt, prompt, max_tokens, block_size, True, attention=attention,
                          **options)
        keeping = run_one(ckpt, prompt, max_tokens, block_size, False, attention=attention,
                          **options)
    return {"prompt_tokens": prompt_len, "new_tokens": max_tokens, "block_size": block_size,
            "window": window, "attention": attention,
            "peak_blocks_freeing": freeing["peak_blocks"],
            "peak_blocks_keeping": keeping["peak_blocks"],
            "blocks_given_back": freeing["blocks_given_back"],
            "usable_blocks": {"freeing": freeing["usable_blocks"],
                              "keeping": keeping["usable_blocks"]},
            "identical_text": freeing["tokens"] == keeping["tokens"],
            "tokens": len(freeing["tokens"])}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m nanoserve.bench.window_pool",
                                description=__doc__.splitlines()[0])
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=480)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--attention", default="reference")
    a = p.parse_args(argv)
    out = measure(a.prompt_len, a.max_tokens, a.block_size, a.window, a.attention)
    print(json.dumps(out, indent=1))
    return 0 if out["identical_text"] else 1


if __name__ == "__main__":
    sys.exit(main())

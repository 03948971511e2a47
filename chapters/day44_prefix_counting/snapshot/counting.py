"""Day 44 snapshot (frozen): what the prefix cache's counters must read, worked out beforehand.

The counters keep vLLM's meaning. ``prefix_cache_queries`` counts the prompt tokens a newly
admitted request looks up; ``prefix_cache_hits`` counts those found cached, so hits / queries is
the share of prompt tokens not computed; ``prefix_cache_evicted_blocks`` counts cached blocks
given up to hold new K/V. For workloads simple enough, each has a closed form:

- N requests of L prompt tokens that share their first P tokens and differ at token P, sent one
  after another at block size B: the first hits nothing and registers every full block it
  computes; each later one hits the blocks wholly inside the shared prefix and short of its last
  token (whose logits pick the first output token). Hits: (N - 1) * B * floor(min(P, L - 1) / B);
  queries: N * L.
- N prompts sharing nothing, each computing c = L + G - 1 tokens (G output tokens; the last is
  never fed back), with c a multiple of B, through a pool of K blocks: every block a request
  fills is cached when it finishes, so once the K never-cached blocks are used up each new block
  evicts one. Evictions: max(0, N * c / B - K).

>>> expected_hits(8, 200, 128, 16), expected_queries(8, 200)
(896, 1600)
>>> expected_hits(3, 40, 40, 16)  # identical prompts: the last token is always computed
64
>>> expected_evictions(6, 40, 9, 16, 8)
10
"""

from __future__ import annotations


def expected_hits(n: int, prompt_len: int, prefix_len: int, block_size: int) -> int:
    """Tokens found cached: N requests of L tokens sharing P, one after another, block size B."""
    if not (n >= 1 and prompt_len >= 1 and 0 <= prefix_len <= prompt_len and block_size >= 1):
        raise ValueError(f"no such workload: N={n}, L={prompt_len}, P={prefix_len}, "
                         f"B={block_size}")
    return (n - 1) * block_size * (min(prefix_len, prompt_len - 1) // block_size)


def expected_queries(n: int, prompt_len: int) -> int:
    """Prompt tokens looked up: every request's whole prompt, once (none is preempted)."""
    return n * prompt_len


def expected_evictions(n: int, prompt_len: int, max_tokens: int, block_size: int,
                       num_blocks: int) -> int:
    """Cached blocks evicted by N unrelated requests that fill whole blocks, one after another."""
    computed = prompt_len + max_tokens - 1
    if computed % block_size:
        raise ValueError(f"{computed} computed tokens do not fill whole blocks of {block_size}; "
                         f"the closed form needs them to")
    return max(0, n * computed // block_size - num_blocks)


def hit_rate(hits: int, queries: int) -> float:
    """The share of looked-up prompt tokens found cached (0 when nothing was looked up)."""
    return hits / queries if queries else 0.0

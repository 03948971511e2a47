"""Day 33's numbers: the log's table, exactly, and the cramped engine's text against the roomy's."""

from __future__ import annotations

import functools

from chapters.common import SHIPPED
from chapters.runner import exact

from .snapshot.harness import run_scheduled

POOLS = (48, 96, 128)


@functools.cache
def row(pool: int, policy: str) -> dict:
    """Four requests, 5-token prompts, 24 tokens each, 4 slots, block_size 4."""
    return run_scheduled(slots=4, block_size=4, pool_tokens=pool, prompt_len=5, gen_lens=[24],
                         requests=4, policy=policy)


def table_row(pool: int, policy: str) -> str:
    r = row(pool, policy)
    pre = "n/a" if policy == "reserve" else str(r["preemptions"])
    return f"{r['forward_passes']}, {r['occupancy']:.3f}, {pre}, {r['recomputed_tokens']}"


def either_row() -> str:
    a, b = row(128, "reserve"), row(128, "incremental")
    same = all(a[k] == b[k] for k in ("forward_passes", "occupancy", "recomputed_tokens"))
    return table_row(128, "incremental") if same else "the policies differ"


def day29_blocks(policy: str) -> int:
    return run_scheduled(8, 4, 1024, 5, [4, 4, 4, 4, 4, 4, 4, 32], 8, policy)["peak_blocks_held"]


def cramped_equals_roomy() -> str:
    """nanoserve-tiny, 10 prompts, greedy: a 14-block pool against the default pool."""
    from nanoserve import LLM, SamplingParams

    kw = dict(dtype="float32", block_size=4, max_num_seqs=6)
    prompts = [[0, *range(3 + i, 8 + i + i % 4)] for i in range(10)]
    params = [SamplingParams(temperature=0, max_tokens=10 + 3 * i, ignore_eos=True)
              for i in range(10)]
    roomy, cramped = LLM(SHIPPED, **kw), LLM(SHIPPED, num_kv_blocks=14, **kw)
    a = [o.token_ids for o in roomy.generate(prompts, params)]
    b = [o.token_ids for o in cramped.generate(prompts, params)]
    same = sum(x == y for x, y in zip(a, b, strict=True))
    return f"{same} of 10 identical, {cramped.stats.preemptions} preemptions"


def day29_preemptions_in_16_blocks() -> str:
    n = run_scheduled(8, 4, 64, 5, [4] * 7 + [32], 8, "incremental")["preemptions"]
    return "no preemption" if n == 0 else f"{n} preemptions"


CLAIMS = [
    exact("pool 48, Week 8: iterations, occupancy, preemptions, tokens recomputed",
          lambda: table_row(48, "reserve")),
    exact("pool 48, Day 33", lambda: table_row(48, "incremental")),
    exact("pool 96, Week 8", lambda: table_row(96, "reserve")),
    exact("pool 96, Day 33", lambda: table_row(96, "incremental")),
    exact("pool 128, either policy", either_row),
    exact("rows per forward, pool 96: Week 8 vs Day 33",
          lambda: f"{row(96, 'reserve')['occupancy'] * 4:.1f} vs "
                  f"{row(96, 'incremental')['occupancy'] * 4:.1f}"),
    exact("Day-29 shape: blocks to run all eight at once, Week 8 vs Day 33",
          lambda: f"{day29_blocks('reserve')} against {day29_blocks('incremental')}"),
    exact("Day-29 shape in a 16-block pool under Day 33", day29_preemptions_in_16_blocks),
    exact("`reservation_waste` under Day 33 (pool 96)",
          lambda: row(96, "incremental")["reservation_waste"]),
    exact("cramped vs roomy engine on nanoserve-tiny", cramped_equals_roomy),
]

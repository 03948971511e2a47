"""Day 44's numbers: the prefix cache's counters, predicted first, then read from the live engine
twice, in process (``LLM.stats``) and over HTTP (``/metrics`` of a real ``nanoserve serve``).

The shipped nanoserve-tiny in float32, greedy, EOS ignored. Each case of ``CASES`` is N requests
of L prompt tokens sharing their first P tokens at block size B (seeded random ids, BOS first;
after the shared prefix each request's first token is its own, so two requests share exactly P),
4 output tokens each, sent one after another. The eviction case sends ``EVICT_N`` unrelated
40-token prompts with 9 output tokens each through an 8-block pool. The servers are child
processes started by ``local_server`` on free 127.0.0.1 ports, one per block size; counters over
HTTP are read as the increase across each case, parsed by ``prometheus_client``.
"""

from __future__ import annotations

import functools
import random
from concurrent.futures import ThreadPoolExecutor

import torch

from chapters.common import SHIPPED, one_thread
from chapters.runner import exact

from .snapshot.counting import expected_evictions, expected_hits, expected_queries, hit_rate

CASES = {  # name: (N requests, L prompt tokens, P shared, B block size)
    "A": (8, 200, 128, 16),
    "B": (8, 200, 100, 16),  # P not a multiple of B: the block it ends in is not shared
    "C": (5, 128, 128, 16),  # identical prompts, L a multiple of B: the last block is computed
    "D": (6, 50, 33, 4),
    "E": (4, 64, 64, 4),  # identical prompts again, at block_size 4
}
MAX_TOKENS = 4
EVICT_N, EVICT_L, EVICT_G, EVICT_B, EVICT_K = 6, 40, 9, 16, 8
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_evicted_blocks")


def ids(seed: int, n: int, bos: bool = True) -> list[int]:
    rng = random.Random(seed)
    head = [0] if bos else []
    return head + [rng.randrange(2, 2048) for _ in range(n - len(head))]


def case_prompts(name: str, seed: int = 0) -> list[list[int]]:
    """The case's N prompts: a shared P-token prefix, then a tail whose first token is the
    request's own (2 + i), so no two requests share more than P tokens."""
    n, length, prefix, _ = CASES[name]
    shared = ids(1000 * (ord(name) - 64) + seed, prefix)
    return [shared + ([2 + i] + ids(10_000 + 100 * seed + i, length - prefix - 1, bos=False)
                      if length > prefix else []) for i in range(n)]


def evict_prompts() -> list[list[int]]:
    return [ids(50_000 + i, EVICT_L) for i in range(EVICT_N)]


def predicted(name: str) -> tuple[int, int]:
    n, length, prefix, bs = CASES[name]
    return expected_hits(n, length, prefix, bs), expected_queries(n, length)


def greedy(max_tokens: int = MAX_TOKENS):
    from nanoserve import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def hits_of(pairs) -> str:
    return "; ".join(f"{h:,} of {q:,}" for h, q in pairs)


# ---------------------------------------------------------------- in process: LLM.stats


@functools.cache
def in_process() -> dict:
    """Every case through one caching LLM per block size, one request per generate() call;
    per case and per request, the increase of llm.stats' counters."""
    from nanoserve import LLM

    out: dict = {"per_request": {}}
    engines: dict = {}
    with one_thread(), torch.inference_mode():
        for name, (_, _, _, bs) in CASES.items():
            lm = engines.setdefault(bs, LLM(SHIPPED, dtype="float32", block_size=bs,
                                            enable_prefix_caching=True))
            s = lm.stats
            before = (s.prefix_cache_hits, s.prefix_cache_queries)
            rows = []
            for p in case_prompts(name):
                h, q = s.prefix_cache_hits, s.prefix_cache_queries
                lm.generate([p], greedy())
                rows.append((s.prefix_cache_hits - h, s.prefix_cache_queries - q))
            out[name] = (s.prefix_cache_hits - before[0], s.prefix_cache_queries - before[1])
            assert s.preemptions == 0, "the formula assumes no request is looked up twice"
            out["per_request"][name] = rows
        lm = LLM(SHIPPED, dtype="float32", block_size=EVICT_B, num_kv_blocks=EVICT_K,
                 enable_prefix_caching=True)
        for p in evict_prompts():
            lm.generate([p], greedy(EVICT_G))
        pool = lm.core.scheduler.kv_cache_manager
        assert lm.stats.preemptions == 0
        out["evict"] = {"evicted": lm.stats.prefix_cache_evictions,
                        "hits": lm.stats.prefix_cache_hits, "cached": pool.num_cached,
                        "blocks": pool.num_blocks, "usage": lm.core.snapshot().kv_cache_usage}
        off = LLM(SHIPPED, dtype="float32", block_size=16)
        for p in case_prompts("A"):
            off.generate([p], greedy())
        s = off.stats
        out["off"] = (s.prefix_cache_queries, s.prefix_cache_hits, s.prefix_cache_evictions)
    return out


@functools.cache
def preempted_lookups() -> tuple[int, int]:
    """Day 43's mixed prompts with caching on, in one generate() call (no aborts) through its
    40-block pool under its 32-token budget: prompt tokens looked up against prompt tokens sent.
    A preempted request that resumes looks the cache up again, but as in vLLM only a new
    request's lookup is counted."""
    from chapters.day43_prefix_caching.claims import MIXED, mixed_workload
    from nanoserve import LLM, SamplingParams

    lm = LLM(SHIPPED, enable_prefix_caching=True, **MIXED)
    work = mixed_workload()
    with one_thread(), torch.inference_mode():
        lm.generate([p for p, _ in work], [SamplingParams(max_tokens=m, temperature=0,
                                                          ignore_eos=True) for _, m in work])
    return lm.stats.prefix_cache_queries, lm.stats.prompt_tokens, lm.stats.preemptions


# ---------------------------------------------------------------- over HTTP: /metrics


def scrape(url: str) -> dict[str, float]:
    """The three prefix-cache counters and the KV usage gauge, as /metrics shows them."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    want = {f"nanoserve:{c}_total": c for c in COUNTERS}
    want["nanoserve:kv_cache_usage_perc"] = "kv_cache_usage_perc"
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in want:
                out[want[sample.name]] = sample.value
    missing = set(want.values()) - set(out)
    if missing:
        raise AssertionError(f"/metrics lacks {sorted(missing)}")
    return out


def _client(url: str):
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    return client, client.models.list().data[0].id


def _send(url: str, prompts, max_tokens: int, concurrent: bool = False) -> dict[str, float]:
    """Send ``prompts`` (one after another, or all at once) and return the counters' increase."""
    client, model = _client(url)

    def ask(p):
        r = client.completions.create(model=model, prompt=p, max_tokens=max_tokens,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.prompt_tokens == len(p) and r.usage.completion_tokens == max_tokens
        return r

    before = scrape(url)
    if concurrent:
        with ThreadPoolExecutor(len(prompts)) as pool:
            list(pool.map(ask, prompts))
    else:
        for p in prompts:
            ask(p)
    after = scrape(url)
    return {k: after[k] - before[k] for k in COUNTERS} | {"usage": after["kv_cache_usage_perc"]}


@functools.cache
def over_http() -> dict:
    from nanoserve.bench.local_server import local_server
    from nanoserve.config import DEFAULT_MODEL

    def serve(*flags):
        return local_server(DEFAULT_MODEL, dtype="float32",
                            extra_args=("--enable-prefix-caching", *flags))

    out: dict = {}
    for bs in sorted({c[3] for c in CASES.values()}, reverse=True):
        with serve("--block-size", str(bs)) as server:
            if bs == 16:
                out["fresh"] = scrape(server.url)
            for name, case in CASES.items():
                if case[3] == bs:
                    d = _send(server.url, case_prompts(name), MAX_TOKENS)
                    out[name] = (int(d["prefix_cache_hits"]), int(d["prefix_cache_queries"]))
            if bs == 16:  # case A again, new prompts, all eight at once
                d = _send(server.url, case_prompts("A", seed=1), MAX_TOKENS, concurrent=True)
                out["burst"] = (int(d["prefix_cache_hits"]), int(d["prefix_cache_queries"]))
    with serve("--block-size", str(EVICT_B), "--num-kv-blocks", str(EVICT_K)) as server:
        d = _send(server.url, evict_prompts(), EVICT_G)
        out["evict"] = {"evicted": int(d["prefix_cache_evicted_blocks"]),
                        "hits": int(d["prefix_cache_hits"]), "usage": d["usage"]}
    return out


# ---------------------------------------------------------------- the rows


def formula_row() -> str:
    return ", ".join(f"{predicted(name)[0]:,}" for name in CASES)


def stats_row() -> str:
    return hits_of(in_process()[name] for name in CASES)


def http_row() -> str:
    return hits_of(over_http()[name] for name in CASES)


def predicted_row() -> str:
    return hits_of(predicted(name) for name in CASES)


def evictions_row() -> str:
    e = expected_evictions(EVICT_N, EVICT_L, EVICT_G, EVICT_B, EVICT_K)
    return (f"{e} predicted; {in_process()['evict']['evicted']} in llm.stats; "
            f"{over_http()['evict']['evicted']} on /metrics")


def idle_after_evictions() -> str:
    ip, http = in_process()["evict"], over_http()["evict"]
    return (f"{http['usage']:.1f} on /metrics ({ip['usage']:.1f} in process); "
            f"{ip['cached']} of {ip['blocks']} blocks cached")


def fresh_row() -> str:
    f = over_http()["fresh"]
    return ", ".join(f"{int(f[c])}" for c in COUNTERS)


def per_request_row() -> str:
    """Case A, request by request: the first hits nothing, every later one the same."""
    rows = in_process()["per_request"]["A"]
    later = {h for h, _ in rows[1:]}
    same = later.pop() if len(later) == 1 else sorted(later)
    return f"{rows[0][0]}, then {same} for each of the other {len(rows) - 1}"


def blocks_per_later_request() -> str:
    """Per case, the whole blocks each request after the first found cached: its own hits in
    llm.stats over the block size. Every later request must hit the same number."""
    cells = []
    for name, (_, _, _, bs) in CASES.items():
        later = {h for h, _ in in_process()["per_request"][name][1:]}
        if len(later) != 1:
            cells.append(f"varies: {sorted(later)}")
            continue
        hits = later.pop()
        cells.append(str(hits // bs) if hits % bs == 0 else f"{hits} tokens, not whole blocks")
    return ", ".join(cells)


CLAIMS = [
    exact("predicted before measuring, cases A-E: hits of queries", predicted_row),
    exact("the formula's hits, computed by snapshot/counting.py, cases A-E", formula_row),
    exact("llm.stats, one request after another: hits of queries, cases A-E", stats_row),
    exact("/metrics of `nanoserve serve --enable-prefix-caching`, one request after another "
          "over HTTP: increase of hits of queries, cases A-E", http_row),
    exact("case A, hits request by request (llm.stats)", per_request_row),
    exact("blocks hit by each later request, its hits / B (llm.stats), cases A-E",
          blocks_per_later_request),
    exact("case A again on new prompts, all 8 sent at once over HTTP: hits of queries",
          lambda: hits_of([over_http()["burst"]])),
    exact("hit rate (hits / queries), cases A and C",
          lambda: " and ".join(f"{hit_rate(*in_process()[n]):.1%}" for n in ("A", "C"))),
    exact("a fresh server's counters before any client request: queries, hits, evicted blocks",
          fresh_row),
    exact("6 unrelated 40-token prompts, 9 output tokens each, block_size 16, an 8-block pool: "
          "evicted blocks", evictions_row),
    exact("hits in that run (llm.stats; /metrics)",
          lambda: f"{in_process()['evict']['hits']}; {over_http()['evict']['hits']}"),
    exact("KV usage once idle after that run; blocks still cached",
          idle_after_evictions),
    exact("caching off, case A: queries, hits, evicted blocks (llm.stats)",
          lambda: ", ".join(map(str, in_process()["off"]))),
    exact("Day 43's 16 mixed prompts in one generate() call (40-block pool, 32-token budget): "
          "prompt tokens looked up vs prompt tokens sent",
          lambda: "{:,} vs {:,} ({} preemptions)".format(*preempted_lookups())),
]

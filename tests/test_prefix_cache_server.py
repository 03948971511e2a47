"""``nanoserve serve --enable-prefix-caching --max-num-batched-tokens 256``, driven by the
official ``openai`` client: a burst of requests sharing a long system prompt hits the cache
(``nanoserve:prefix_cache_hits_total`` on ``/metrics`` is above zero) and answers the same text
as the same server with caching off. Both servers are real processes on a free 127.0.0.1 port,
started and stopped by ``local_server``; every request is bounded by its timeout.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from nanoserve.bench.local_server import local_server
from nanoserve.config import DEFAULT_MODEL

SYSTEM = ("You are a careful assistant. Answer in one short sentence, and never make up facts "
          "that the question does not give you. ") * 4
QUESTIONS = ["What is a list?", "What is a dict?", "What is a tuple?", "What is a set?",
             "What does len do?", "What does range do?"]


def counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} is not on /metrics")


def burst(url: str) -> list[str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)

    def ask(q: str) -> str:
        r = client.completions.create(model=client.models.list().data[0].id,
                                      prompt=SYSTEM + q, max_tokens=12, temperature=0)
        return r.choices[0].text

    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        return list(pool.map(ask, QUESTIONS))


def test_a_shared_prefix_burst_hits_and_keeps_its_text():
    flags = ("--max-num-batched-tokens", "256")
    with local_server(DEFAULT_MODEL, dtype="float32", max_num_seqs=8,
                      extra_args=("--enable-prefix-caching", *flags)) as on:
        cached = burst(on.url)
        hits = counter(on.url, "nanoserve:prefix_cache_hits_total")
        queries = counter(on.url, "nanoserve:prefix_cache_queries_total")
    with local_server(DEFAULT_MODEL, dtype="float32", max_num_seqs=8, extra_args=flags) as off:
        plain = burst(off.url)
        assert counter(off.url, "nanoserve:prefix_cache_hits_total") == 0
    assert 0 < hits < queries
    assert cached == plain

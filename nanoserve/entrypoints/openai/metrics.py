"""Prometheus metrics for the server, under vLLM's names with the ``nanoserve:`` prefix.

Why this module exists: an operator's dashboard built for vLLM should work on nanoserve by
changing one prefix. Two kinds of number live here:

- **state** the engine already keeps (running, waiting, KV-cache usage, preemptions, the prefix
  cache's queries, hits and evicted blocks; with speculative decoding on, its drafts, draft
  tokens and accepted tokens, overall and per position) is read from the engine's
  ``snapshot()`` at scrape time by a custom collector, so it can never drift from the truth:
  once the engine is idle, running, waiting and ``kv_cache_usage_perc`` read 0;
- **events** only the server sees (tokens handed out, latencies, how requests ended) are counted
  as each engine request's deltas pass through ``RequestTracker``.

Every app gets its own ``CollectorRegistry``, so two servers in one process (tests) never share a
count. ``kv_cache_usage_perc`` is a fraction from 0 to 1, as in vLLM.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

P = "nanoserve:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _EngineState(Collector):
    """Gauges and the preemption counter, read from the engine at every scrape."""

    def __init__(self, engine, model_name: str, num_spec_tokens: int = 0):
        self.engine, self.model_name = engine, model_name
        self.num_spec_tokens = num_spec_tokens  # k when speculative decoding is on

    def collect(self):
        snap, labels = self.engine.snapshot(), [self.model_name]  # one reading per scrape
        for name, doc, value in (
                ("num_requests_running", "Requests in the running batch.", snap.num_running),
                ("num_requests_waiting", "Requests waiting to be scheduled.", snap.num_waiting),
                ("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1).",
                 snap.kv_cache_usage)):
            g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
            g.add_metric(labels, float(value))
            yield g
        for name, doc, value in (  # counters: Day 57's decode steps, Day 44's prefix cache
                ("num_preemptions", "Preemptions since start.", snap.num_preemptions),
                ("decode_steps_replayed", "Decode steps that replayed a recorded window.",
                 snap.decode_steps_replayed),
                ("decode_steps_scattered", "Decode steps that ran the eager forward.",
                 snap.decode_steps_scattered),
                ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                 snap.prefix_cache_queries),
                ("prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                 snap.prefix_cache_hits),
                ("prefix_cache_evicted_blocks", "Cached KV blocks evicted for new ones.",
                 snap.prefix_cache_evictions)):
            c = CounterMetricFamily(P + name, doc, labels=["model_name"])
            c.add_metric(labels, float(value))
            yield c
        if snap.spec_decode is not None:
            yield from _spec_decode(snap.spec_decode, labels, self.num_spec_tokens)


def _spec_decode(s, labels: list[str], num_spec_tokens: int):
    """Speculative decoding's counters (Day 76), as vLLM's ``SpecDecodingProm`` names them; the
    per-position counter has a ``position`` label, "0" to "k - 1", each present from the start
    (vLLM's acceptance-rate vector is ``..._per_pos / ..._num_drafts``)."""
    for name, doc, value in (
            ("spec_decode_num_drafts", "Number of spec decoding drafts.", s.num_drafts),
            ("spec_decode_num_draft_tokens", "Number of draft tokens.", s.num_draft_tokens),
            ("spec_decode_num_accepted_tokens", "Number of accepted tokens.",
             s.num_accepted_tokens)):
        c = CounterMetricFamily(P + name, doc, labels=["model_name"])
        c.add_metric(labels, float(value))
        yield c
    c = CounterMetricFamily(P + "spec_decode_num_accepted_tokens_per_pos",
                            "Accepted tokens per draft position.",
                            labels=["model_name", "position"])
    per_pos = s.accepted_per_pos
    for pos in range(max(num_spec_tokens, len(per_pos))):
        c.add_metric([*labels, str(pos)], float(per_pos[pos] if pos < len(per_pos) else 0))
    yield c


class ServerMetrics:
    def __init__(self, engine, model_name: str):
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        proposer = getattr(getattr(engine, "core", None), "proposer", None)  # Day 76
        r.register(_EngineState(engine, model_name, proposer.k if proposer is not None else 0))
        lbl = ["model_name"]
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prefilled prompt tokens.", lbl,
                                     registry=r).labels(model_name)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens.", lbl,
                                         registry=r).labels(model_name)
        self.success = Counter(P + "request_success", "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time to first token.", lbl,
                              buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Time between tokens.", lbl,
                             buckets=ITL_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to last token.", lbl,
                             buckets=E2E_BUCKETS, registry=r).labels(model_name)

    def track(self, arrival: float) -> RequestTracker:
        return RequestTracker(self, arrival)


class RequestTracker:
    """One engine request's events: feed it every delta; ``abort()`` if it never finished."""

    __slots__ = ("m", "arrival", "last", "done")

    def __init__(self, m: ServerMetrics, arrival: float):
        self.m, self.arrival, self.last, self.done = m, arrival, None, False

    def delta(self, d) -> None:
        now = time.perf_counter()
        if d.new_token_ids:
            if self.last is None:
                self.m.ttft.observe(now - self.arrival)
                self.m.prompt_tokens.inc(d.num_prompt_tokens)
            else:
                self.m.itl.observe((now - self.last) / len(d.new_token_ids))
            self.m.generation_tokens.inc(len(d.new_token_ids))
            self.last = now
        if d.finished:
            self.done = True
            self.m.success.labels(self.m.model_name, d.finish_reason or "abort").inc()
            self.m.e2e.observe(now - self.arrival)

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self.m.success.labels(self.m.model_name, "abort").inc()

"""The serving benchmark: arrivals, metric arithmetic, and the client against known delays.

A fake OpenAI-style server on 127.0.0.1 streams ``max_tokens`` chunks with a known delay before
the first and between the rest, usage in the last chunk, then ``data: [DONE]``; what the client
measures must sit at or above those delays and the counts must be exact. One test runs the real
``nanoserve serve`` through the no-``--url`` path.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from nanoserve.bench.serve import (
    RequestFuncOutput,
    calculate_metrics,
    rounded,
    run_bench,
)
from nanoserve.bench.workload import (
    arrival_times,
    long_among_short_requests,
    prefix_repetition_requests,
    random_requests,
    request_intervals,
    sample_requests,
)
from nanoserve.cli import main as cli_main

KEYS = {"completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
        "request_throughput", "output_throughput", "total_token_throughput",
        "max_concurrency", "burstiness", "rate", "errors"} | {
        f"{s}_{m}_ms" for s in ("mean", "median", "p99", "std")
        for m in ("ttft", "tpot", "itl", "e2el")}


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 resets a burst of simultaneous connects
    daemon_threads = True


class FakeServer:
    """Streams completions with known delays; counts requests and the peak in flight."""

    def __init__(self, first_delay=0.05, token_delay=0.02, usage=True, fail_every=0,
                 empty_first=False, metrics=False):
        self.first_delay, self.token_delay, self.usage = first_delay, token_delay, usage
        self.fail_every, self.empty_first = fail_every, empty_first
        self.metrics = metrics  # serve /metrics: prompt tokens posted as prefix-cache queries
        self.prompt_tokens = 0
        self.lock = threading.Lock()
        self.in_flight = self.peak = self.posts = 0
        self.payloads: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, body: bytes, ctype="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/metrics" and fake.metrics:
                    with fake.lock:
                        n = fake.prompt_tokens
                    text = (f'fake:prefix_cache_queries_total{{model_name="fake-model"}} {n}.0\n'
                            f'fake:prefix_cache_hits_total{{model_name="fake-model"}} 0.0\n')
                    self._send(200, text.encode(), "text/plain")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": "fake-model", "object": "model"}]}).encode())
                else:
                    self._send(200 if self.path == "/health" else 404, b"{}")

            def _chunk(self, obj):
                data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
                data += b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_POST(self):
                done = False
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.posts += 1
                    n_post = fake.posts
                    fake.payloads.append(body)
                    fake.prompt_tokens += len(body["prompt"])
                    fake.in_flight += 1
                    fake.peak = max(fake.peak, fake.in_flight)
                try:
                    if fake.fail_every and n_post % fake.fail_every == 0:
                        err = {"error": {"message": "boom", "type": "server_error",
                                         "param": None, "code": 500}}
                        self._send(500, json.dumps(err).encode())
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    n = body["max_tokens"]
                    if fake.empty_first:  # a chunk with no text is not a token
                        self._chunk({"choices": [{"index": 0, "text": ""}]})
                    for i in range(n):
                        time.sleep(fake.first_delay if i == 0 else fake.token_delay)
                        self._chunk({"id": "cmpl-1", "object": "text_completion",
                                     "choices": [{"index": 0, "text": f" t{i}",
                                                  "finish_reason": "length" if i == n - 1
                                                  else None}]})
                    if fake.usage:
                        self._chunk({"choices": [], "usage": {
                            "prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                            "total_tokens": len(body["prompt"]) + n}})
                    # out of flight before [DONE]: once the client reads it, it may send the
                    # next request, which this thread must not still be counted beside
                    done = fake.leave()
                    self._chunk(b"[DONE]")
                    self.wfile.write(b"0\r\n\r\n")
                finally:
                    if not done:
                        fake.leave()

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def leave(self) -> bool:
        """One request is no longer in flight; True, for the handler's ``done`` flag."""
        with self.lock:
            self.in_flight -= 1
        return True

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


# ---- the workload ------------------------------------------------------------------------------

def test_arrivals_inf_is_all_at_once_and_finite_rates_are_seeded():
    assert arrival_times(5, math.inf) == [0.0] * 5
    a, b = arrival_times(20, 4.0, seed=3), arrival_times(20, 4.0, seed=3)
    assert a == b and a[0] == 0.0 and all(y >= x for x, y in zip(a, a[1:], strict=False))
    assert arrival_times(20, 4.0, seed=4) != a
    # the schedule scales with the rate: the same draws, half the gaps at twice the rate
    assert np.allclose(np.array(arrival_times(20, 8.0, seed=3)) * 2, a)


def test_intervals_are_gamma_with_mean_one_over_rate():
    rate, n = 5.0, 20000
    for burstiness in (0.5, 1.0, 4.0):
        gaps = np.array(request_intervals(n, rate, burstiness, seed=1))
        assert abs(gaps.mean() - 1 / rate) < 0.05 / rate
        # gamma(k, theta): coefficient of variation 1/sqrt(k); Poisson's exponential gaps give 1
        assert abs(gaps.std() / gaps.mean() - 1 / math.sqrt(burstiness)) < 0.05
    with pytest.raises(ValueError):
        request_intervals(3, 0.0)
    with pytest.raises(ValueError):
        request_intervals(3, 1.0, burstiness=0.0)


def test_random_requests_lengths_ids_and_seed():
    reqs = random_requests(50, 10, 6, 0.5, vocab_size=30, seed=2)
    assert reqs == random_requests(50, 10, 6, 0.5, vocab_size=30, seed=2)
    assert all(5 <= r.prompt_len <= 15 and len(r.prompt) == r.prompt_len for r in reqs)
    assert all(3 <= r.expected_output_len <= 9 for r in reqs)
    assert all(2 <= t < 30 for r in reqs for t in r.prompt)
    assert len({r.prompt_len for r in reqs}) > 1
    fixed = random_requests(4, 10, 6, 0.0, vocab_size=30, seed=2)
    assert {(r.prompt_len, r.expected_output_len) for r in fixed} == {(10, 6)}


def test_prefix_repetition_shares_each_prefix_exactly_and_is_seeded():
    n, plen, slen, k, out = 24, 20, 6, 4, 5
    reqs = prefix_repetition_requests(n, plen, slen, k, out, vocab_size=50, seed=3)
    assert reqs == prefix_repetition_requests(n, plen, slen, k, out, vocab_size=50, seed=3)
    assert reqs != prefix_repetition_requests(n, plen, slen, k, out, vocab_size=50, seed=4)
    assert len(reqs) == n
    assert all(r.prompt_len == len(r.prompt) == plen + slen and r.expected_output_len == out
               for r in reqs)
    assert all(2 <= t < 50 for r in reqs for t in r.prompt) and {r.label for r in reqs} == {""}
    groups: dict[tuple, list] = {}
    for r in reqs:
        groups.setdefault(tuple(r.prompt[:plen]), []).append(tuple(r.prompt[plen:]))
    # num_prefixes distinct prefixes, n / num_prefixes requests each, every suffix its own
    assert len(groups) == k and sorted(len(g) for g in groups.values()) == [n // k] * k
    assert len({sfx for g in groups.values() for sfx in g}) == n
    # shuffled: the requests of one prefix do not come in one run
    order = [tuple(r.prompt[:plen]) for r in reqs]
    assert sum(a != b for a, b in zip(order, order[1:], strict=False)) > k - 1
    with pytest.raises(ValueError, match="not a multiple"):
        prefix_repetition_requests(10, plen, slen, 4, out, vocab_size=50, seed=0)
    with pytest.raises(ValueError):
        prefix_repetition_requests(4, plen, 0, 2, out, vocab_size=50, seed=0)
    assert [len(r.prompt) for r in prefix_repetition_requests(2, 0, 3, 1, 1, 50, 0)] == [3, 3]


def test_long_among_short_puts_every_kth_long_and_is_seeded():
    n, k = 14, 4
    reqs = long_among_short_requests(n, 6, 12, 40, k, 3, vocab_size=50, seed=1)
    assert reqs == long_among_short_requests(n, 6, 12, 40, k, 3, vocab_size=50, seed=1)
    assert reqs != long_among_short_requests(n, 6, 12, 40, k, 3, vocab_size=50, seed=2)
    longs = [i for i, r in enumerate(reqs, 1) if r.label == "long"]
    assert longs == [4, 8, 12]
    for i, r in enumerate(reqs, 1):
        want = (40, 3) if i % k == 0 else (6, 12)
        assert (r.prompt_len, len(r.prompt), r.expected_output_len) == (want[0], *want)
        assert r.label == ("long" if i % k == 0 else "short")
    assert all(2 <= t < 50 for r in reqs for t in r.prompt)
    assert sum(r.prompt_len for r in reqs) == 3 * 40 + 11 * 6
    assert {r.label for r in long_among_short_requests(3, 2, 2, 5, 1, 1, 50, 0)} == {"long"}
    with pytest.raises(ValueError):
        long_among_short_requests(4, 6, 12, 40, 0, 3, vocab_size=50, seed=0)


def test_sample_requests_picks_the_dataset_and_refuses_what_it_does_not_take():
    assert sample_requests("random", 5, 40, 7, input_len=6, output_len=3, range_ratio=0.5) == \
        random_requests(5, 6, 3, 0.5, 40, 7)
    assert sample_requests("prefix_repetition", 4, 40, 7, prefix_len=5, suffix_len=2,
                           num_prefixes=2, output_len=3) == \
        prefix_repetition_requests(4, 5, 2, 2, 3, 40, 7)
    assert sample_requests("long_among_short", 4, 40, 7, input_len=3, output_len=9, long_len=20,
                           long_every=2, long_output_len=2) == \
        long_among_short_requests(4, 3, 9, 20, 2, 2, 40, 7)
    with pytest.raises(ValueError, match="choose one of"):
        sample_requests("sharegpt", 4, 40, 0)
    with pytest.raises(ValueError, match="prefix_repetition"):
        sample_requests("prefix_repetition", 4, 40, 0, prefix_len=5, suffix_len=2,
                        num_prefixes=2, output_len=3, range_ratio=0.1)
    with pytest.raises(ValueError, match="long_among_short"):
        sample_requests("long_among_short", 4, 40, 0, input_len=3, output_len=9)


# ---- the arithmetic ----------------------------------------------------------------------------

def test_calculate_metrics_matches_hand_arithmetic():
    outs = [RequestFuncOutput(True, 10, 5, ttft=0.1, itl=[0.02, 0.02, 0.03, 0.03], latency=0.2),
            RequestFuncOutput(True, 20, 1, ttft=0.3, itl=[], latency=0.3),
            RequestFuncOutput(False, 7, 0, error="HTTP 500")]
    m = calculate_metrics(outs, duration_s=2.0)
    assert (m["completed"], m["failed"]) == (2, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (30, 6)
    assert m["request_throughput"] == 1.0 and m["output_throughput"] == 3.0
    assert m["total_token_throughput"] == 18.0
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 200)  # numpy's linear interpolation
    assert m["std_ttft_ms"] == pytest.approx(100.0)
    # TPOT only for requests of more than one token: (0.2 - 0.1) / 4
    assert m["mean_tpot_ms"] == pytest.approx(25.0)
    assert m["mean_itl_ms"] == pytest.approx(25.0)
    assert m["median_itl_ms"] == pytest.approx(25.0)
    assert m["p99_itl_ms"] == pytest.approx(np.percentile([20, 20, 30, 30], 99))
    assert m["mean_e2el_ms"] == pytest.approx(250.0)
    assert calculate_metrics([RequestFuncOutput()], 1.0)["mean_ttft_ms"] == 0.0  # vLLM's `or 0`
    assert rounded([{"a": 1.23456, "rate": "inf", "n": 3}]) == [{"a": 1.23, "rate": "inf",
                                                                  "n": 3}]


# ---- the client against known delays -----------------------------------------------------------

def test_client_times_against_known_delays_and_counts_exactly():
    first, gap, n, out_len = 0.06, 0.02, 6, 5
    with FakeServer(first_delay=first, token_delay=gap, empty_first=True) as srv:
        [m] = run_bench(srv.url, [math.inf], n, input_len=8, output_len=out_len, seed=1)
    assert set(m) >= KEYS
    assert m["rate"] == "inf" and m["burstiness"] == 1.0 and m["max_concurrency"] is None
    assert (m["completed"], m["failed"]) == (n, 0)
    assert m["total_output_tokens"] == n * out_len and m["total_input_tokens"] == n * 8
    assert first * 1000 <= m["mean_ttft_ms"] < (first + 0.5) * 1000
    # a busy client may read two chunks in one wake-up, so the gaps get a loose lower bound;
    # TTFT and E2EL cannot come in under what the server slept
    assert gap * 1000 * 0.5 <= m["median_itl_ms"] < (gap + 0.3) * 1000
    assert gap * 1000 * 0.5 <= m["mean_tpot_ms"] < (gap + 0.3) * 1000
    assert m["mean_e2el_ms"] >= (first + (out_len - 1) * gap) * 1000
    assert m["duration_s"] >= first + (out_len - 1) * gap
    assert m["output_throughput"] == pytest.approx(n * out_len / m["duration_s"])
    # the probe request plus n; every payload is vLLM's streaming, EOS-blind, greedy request
    assert srv.posts == n + 1
    p = srv.payloads[-1]
    assert p["stream"] is True and p["ignore_eos"] is True and p["temperature"] == 0.0
    assert p["stream_options"] == {"include_usage": True} and p["model"] == "fake-model"
    assert p["max_tokens"] == out_len and len(p["prompt"]) == 8


def test_without_usage_tokens_are_counted_by_chunks_and_failures_are_counted():
    with FakeServer(first_delay=0.01, token_delay=0.005, usage=False, fail_every=3) as srv:
        [m] = run_bench(srv.url, [math.inf], 8, input_len=4, output_len=3, seed=0)
    # posts 1 (the probe) .. 9: posts 3, 6, 9 fail, which are 3 of the 8 timed requests
    assert (m["completed"], m["failed"]) == (5, 3)
    [(error, count)] = m["errors"].items()
    assert count == 3 and error.startswith("HTTP 500") and "boom" in error
    assert m["total_output_tokens"] == 5 * 3


def test_max_concurrency_caps_requests_in_flight():
    with FakeServer(first_delay=0.03, token_delay=0.01) as srv:
        [capped] = run_bench(srv.url, [math.inf], 8, input_len=4, output_len=3,
                             max_concurrency=2)
        assert srv.peak <= 2 and capped["completed"] == 8 and capped["max_concurrency"] == 2
        srv.peak = 0
        run_bench(srv.url, [math.inf], 8, input_len=4, output_len=3)
        assert srv.peak > 2


def test_a_finite_rate_spreads_the_requests_over_the_schedule():
    n, rate = 6, 40.0
    with FakeServer(first_delay=0.005, token_delay=0.005) as srv:
        [m, inf] = run_bench(srv.url, [rate, math.inf], n, input_len=4, output_len=2, seed=5)
    assert m["rate"] == rate and inf["rate"] == "inf"
    assert m["duration_s"] >= arrival_times(n, rate, seed=5)[-1]
    assert m["completed"] == inf["completed"] == n


def test_run_bench_works_from_inside_a_running_loop():
    """A notebook already runs an event loop; run_bench must not need asyncio.run there."""
    import asyncio

    async def from_a_notebook(url):
        return run_bench(url, [math.inf], 2, input_len=4, output_len=2)

    with FakeServer(first_delay=0.005, token_delay=0.005) as srv:
        [m] = asyncio.run(from_a_notebook(srv.url))
    assert m["completed"] == 2


def test_cli_json_is_one_list_with_inf_as_a_string(capsys):
    with FakeServer(first_delay=0.01, token_delay=0.005) as srv:
        rc = cli_main(["bench", "serve", "--url", srv.url, "--rates", "20,inf",
                       "--requests", "3", "--input-len", "4", "--output-len", "3",
                       "--burstiness", "2", "--json", "--no-progress"])
    cap = capsys.readouterr()
    assert rc == 0
    out = json.loads(cap.out)
    assert [r["rate"] for r in out] == [20.0, "inf"]
    assert all(set(r) >= KEYS and r["burstiness"] == 2.0 for r in out)
    assert all(r["total_output_tokens"] == 9 for r in out)
    assert "Mean TTFT (ms)" in cap.err and "Output token throughput" in cap.err
    # the table shows the JSON's numbers
    assert f"{out[0]['mean_ttft_ms']:.2f}" in cap.err


def test_cli_refuses_a_bad_rate_and_a_dead_url(capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "serve", "--rates", "0,inf"])
    from nanoserve.bench.local_server import free_port

    rc = cli_main(["bench", "serve", "--url", f"http://127.0.0.1:{free_port()}",
                   "--rates", "inf", "--requests", "2", "--no-progress",
                   "--request-timeout", "2"])
    assert rc == 2 and "test request" in capsys.readouterr().err


def test_cli_prefix_repetition_sends_the_shared_prefixes_and_reports_server_counters(capsys):
    with FakeServer(first_delay=0.005, token_delay=0.002, metrics=True) as srv:
        rc = cli_main(["bench", "serve", "--url", srv.url, "--rates", "inf", "--requests", "6",
                       "--dataset-name", "prefix_repetition",
                       "--prefix-repetition-prefix-len", "10",
                       "--prefix-repetition-suffix-len", "3",
                       "--prefix-repetition-num-prefixes", "2",
                       "--prefix-repetition-output-len", "4", "--json", "--no-progress"])
        payloads = srv.payloads
    cap = capsys.readouterr()
    assert rc == 0
    [m] = json.loads(cap.out)
    assert m["dataset_name"] == "prefix_repetition" and m["dataset_options"] == {
        "prefix_len": 10, "suffix_len": 3, "num_prefixes": 2, "output_len": 4}
    assert (m["completed"], m["total_input_tokens"], m["total_output_tokens"]) == (6, 78, 24)
    timed = payloads[1:]  # after the probe, which sends the first request's prompt; at rate inf
    assert payloads[0]["prompt"] in [p["prompt"] for p in timed]  # the rest arrive in any order
    assert all(p["max_tokens"] == 4 and len(p["prompt"]) == 13 for p in timed)
    assert len({tuple(p["prompt"][:10]) for p in timed}) == 2
    # the counters are read before and after the rate: the probe's tokens are not in them
    assert m["server_counters"] == {"prefix_cache_queries": 78, "prefix_cache_hits": 0}
    assert "Server prefix cache queries" in cap.err and "prefix_repetition: 2 prefixes" in cap.err


def test_long_among_short_reports_each_class_and_details():
    with FakeServer(first_delay=0.005, token_delay=0.002) as srv:
        [m] = run_bench(srv.url, [math.inf], 6, input_len=4, output_len=5, seed=0,
                        dataset_name="long_among_short",
                        dataset_options={"long_len": 30, "long_every": 3, "long_output_len": 2},
                        detailed=True)
    assert m["server_counters"] == {}  # no /metrics: nothing reported, nothing made up
    assert (m["completed"], m["total_input_tokens"], m["total_output_tokens"]) == (6, 76, 24)
    g = m["groups"]
    assert set(g) == {"long", "short"}
    assert (g["long"]["completed"], g["long"]["total_input_tokens"]) == (2, 60)
    assert (g["short"]["completed"], g["short"]["total_output_tokens"]) == (4, 20)
    assert g["long"]["mean_ttft_ms"] > 0 and "errors" not in g["long"]
    d = m["details"]
    assert d["input_lens"] == [4, 4, 30, 4, 4, 30] and d["output_lens"] == [5, 5, 2, 5, 5, 2]
    assert [len(x) for x in d["itls"]] == [4, 4, 1, 4, 4, 1] and d["errors"] == [""] * 6
    assert d["generated_texts"][2] == " t0 t1" and len(d["ttfts"]) == 6
    with FakeServer(first_delay=0.005, token_delay=0.002) as srv:
        [plain] = run_bench(srv.url, [math.inf], 3, input_len=4, output_len=2)
    assert "groups" not in plain and "details" not in plain  # one class, not detailed


def test_server_counters_read_prometheus_text():
    from nanoserve.bench.serve_metrics import server_counters

    text = "\n".join([
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 6656.0',
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 10.0',
        'vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.79e+09',
        'nanoserve:num_preemptions_total{model_name="m"} 3.0',
        "nanoserve:prompt_tokens_total 99.0"])
    assert server_counters(text) == {"prefix_cache_hits": 6666, "num_preemptions": 3}
    assert server_counters("") == {}


# ---- the real server ---------------------------------------------------------------------------

def test_real_server_without_url():
    pytest.importorskip("nanoserve.entrypoints.openai.serve")
    [m] = run_bench(None, [math.inf], 4, input_len=8, output_len=4, seed=0, dtype="float32",
                    server_timeout_s=120)
    assert (m["completed"], m["failed"]) == (4, 0)
    assert m["total_output_tokens"] == 16 and m["total_input_tokens"] >= 32
    assert m["mean_ttft_ms"] > 0 and m["mean_itl_ms"] > 0


def test_engine_flags_reach_the_started_server_as_its_own():
    """The bench's engine flags are ``nanoserve serve``'s (``EngineConfig.add_cli_args``), and
    those set away from their defaults reach the started server's command line spelt the same."""
    import argparse

    from nanoserve.bench.local_server import engine_argv, engine_options_set
    from nanoserve.bench.serve_cli import add_arguments
    from nanoserve.config import EngineConfig
    from nanoserve.entrypoints.openai import serve

    bench, server = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_arguments(bench)
    serve.add_arguments(server)
    argv = ["--dtype", "float32", "--max-num-seqs", "4", "--cuda-graphs", "--no-persistent-batch",
            "--prepack", "off", "--no-enable-chunked-prefill", "--num-gpu-blocks-override", "64",
            "--fail-on-step", "3", "5"]
    args = bench.parse_args(["--rates", "inf", *argv])
    passed = engine_argv(engine_options_set(args))
    assert EngineConfig.from_cli_args(server.parse_args(passed)) == \
        EngineConfig.from_cli_args(args)
    assert engine_options_set(bench.parse_args([])) == {}  # nothing set: nothing passed
    with pytest.raises(ValueError, match="not an engine option"):
        engine_argv({"max_num_seq": 4})


def test_real_server_prefix_caching_hits_are_what_the_workload_determines():
    """Two prefixes of 64 ids (4 blocks of 16), 4 requests each with an 8-id suffix. The probe
    computes the first request's prompt, so only the other prefix's first request misses: 7
    requests hit 64 tokens each, and the counters count the 8 timed prompts."""
    pytest.importorskip("nanoserve.entrypoints.openai.serve")
    opts = {"prefix_len": 64, "suffix_len": 8, "num_prefixes": 2, "output_len": 2}
    [m] = run_bench(None, [math.inf], 8, seed=0, dtype="float32", server_timeout_s=120,
                    engine_args=("--enable-prefix-caching",), dataset_name="prefix_repetition",
                    dataset_options=opts)
    assert (m["completed"], m["failed"], m["total_input_tokens"]) == (8, 0, 8 * 72)
    assert m["server_counters"] == {"prefix_cache_queries": 8 * 72, "prefix_cache_hits": 7 * 64,
                                    "prefix_cache_evicted_blocks": 0, "num_preemptions": 0}


@pytest.mark.parametrize("dataset", ["random", "prefix_repetition", "long_among_short"])
def test_every_dataset_runs_with_the_default_flags(dataset, capsys):
    # a default that the generator refuses (64 requests over vLLM's 10 prefixes) is a trap
    with FakeServer(first_delay=0.0, token_delay=0.0) as srv:
        rc = cli_main(["bench", "serve", "--url", srv.url, "--rates", "inf",
                       "--dataset-name", dataset, "--json", "--no-progress"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    [m] = json.loads(cap.out)
    assert (m["dataset_name"], m["completed"], m["failed"]) == (dataset, 64, 0)

"""Day 46's numbers: the whole fuzzer against a real server on 127.0.0.1, every count exact.

The server (``chapters/day38_server/live.py``): nanoserve-tiny in float32 behind ``build_app``,
uvicorn on a free port of 127.0.0.1 in a thread, 4 slots, a 64-block pool of block_size 4, the
default 4 MiB body limit, the model's 1,024-token context. The cases: every one of
``bad_requests(seed=46, vocab_size=2048, max_model_len=1024)``, sent once by ``run_fuzz`` and
once more by a plain loop here that keeps each status and body for the frozen check. Then the
five inputs the fuzzer's first run broke, one by one, while a greedy stream runs beside them;
then the frozen compact cases.
"""

from __future__ import annotations

import collections
import functools
import json
import socket
import threading
import time

from chapters.runner import exact, timed

from .snapshot.cases import compact_cases, error_shape_ok

SEED = 46


def _post_raw(port: int, body: bytes, sock: socket.socket | None = None
              ) -> tuple[socket.socket, int, bytes]:
    """One POST /v1/completions on ``sock`` (or a new connection); the whole response read."""
    s = sock or socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return s, 0, b""  # the connection was closed or reset: no answer
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = next(int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += s.recv(65536)
    return s, int(lines[0].split()[1]), rest


def _first_bugs(live, client) -> dict:
    """The five inputs of the first run's five bugs, with a greedy stream running beside them."""
    port = int(live.url.rsplit(":", 1)[1])
    beside: dict = {}
    started = threading.Event()

    def neighbour():
        body = {"prompt": [0, 17, 6, 7], "max_tokens": 200, "ignore_eos": True,
                "temperature": 0, "stream": True, "return_token_ids": True}
        events = []
        with client.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    started.set()
        beside["finish"] = [e["choices"][0]["finish_reason"] for e in events
                            if e.get("choices") and e["choices"][0]["finish_reason"]]
        beside["tokens"] = sum(len(e["choices"][0]["token_ids"] or []) for e in events
                               if e.get("choices"))
    t = threading.Thread(target=neighbour)
    t.start()
    started.wait(30)
    deep = "[" * 5000 + "]" * 5000
    codes = []
    for body in (b'{"prompt": ' + deep.encode() + b"}",
                 b'{"prompt": "a\xed\xa0\x80", "max_tokens": 2}',
                 json.dumps({"prompt": "The for", "top_k": 10**30}).encode()):
        s, status, _ = _post_raw(port, body)
        s.close()
        codes.append(status)
        beside["running"] = live.engine.num_running  # after the top_k case: the stream's still on
    codes.append(client.post("/v1/completions", content=b'{"prompt": "The for"}',
                             headers={"content-type": "text/plain"}).status_code)
    big = json.dumps({"prompt": "a" * (5 << 20)}).encode()
    s, first, _ = _post_raw(port, big)
    _, second, _ = _post_raw(port, json.dumps({"prompt": "The for", "max_tokens": 2}).encode(),
                             s)
    s.close()
    codes.append((first, second))
    t.join(60)
    return {"codes": codes, "neighbour": beside}


@functools.cache
def run() -> dict:
    import httpx

    from chapters.day38_server.live import live_server
    from nanoserve.bench.fuzz import CATEGORIES, bad_requests, run_fuzz

    r: dict = {}
    with live_server(max_num_seqs=4, num_kv_blocks=64, block_size=4) as live:
        vocab, max_len = live.engine.vocab_size, live.engine.max_model_len
        cases = bad_requests(seed=SEED, vocab_size=vocab, max_model_len=max_len)
        r["vocab"], r["max_len"] = vocab, max_len
        r["cases"] = cases
        r["order"] = list(CATEGORIES)
        t = time.perf_counter()
        r["report"] = run_fuzz(live.url, cases)
        r["fuzz_s"] = time.perf_counter() - t
        added = lambda: live.engine.core.counters.requests_added  # noqa: E731
        with httpx.Client(base_url=live.url, timeout=60, trust_env=False) as c:
            a0 = added()
            r["answers"] = [(c.post(k.path, content=k.body, headers=dict(k.headers)))
                            for k in cases]
            r["answers"] = [(a.status_code, a.content) for a in r["answers"]]
            r["opened"] = added() - a0
            r["bugs"] = _first_bugs(live, c)
            frozen = compact_cases(vocab, max_len)
            r["frozen"] = [(cat, c.post(path, content=body, headers=dict(h)))
                           for cat, path, h, body in frozen]
            r["frozen"] = [(cat, a.status_code, a.content) for cat, a in r["frozen"]]
        live.idle()
        r["pool"] = (live.pool.num_free, live.pool.num_blocks)
    return r


def per_category() -> str:
    counts = collections.Counter(c.category for c in run()["cases"])
    return ", ".join(str(counts[name]) for name in run()["order"])


def statuses() -> str:
    counts = collections.Counter(s for s, _ in run()["answers"])
    return ", ".join(f"{s} x {n}" for s, n in sorted(counts.items()))


def first_bugs() -> str:
    *codes, (too_big, after) = run()["bugs"]["codes"]
    return ", ".join(str(c) for c in codes) + f", {too_big} then {after}"


def neighbour() -> str:
    n = run()["bugs"]["neighbour"]
    finish = n["finish"][0] if len(n["finish"]) == 1 else n["finish"]
    return f"{'yes' if n['running'] == 1 else 'no'}, {finish}, {n['tokens']}"


def frozen_cases() -> int:
    seen = {cat for cat, status, body in run()["frozen"] if error_shape_ok(status, body)}
    return len(seen)


CLAIMS = [
    exact("distinct bad requests, seed 46", lambda: len(run()["cases"])),
    exact("categories", lambda: len({c.category for c in run()["cases"]})),
    exact("cases per category, in the order of the table above", per_category),
    exact("answered with a 4xx", lambda: "{} of {}".format(run()["report"]["4xx"],
                                                           run()["report"]["cases"])),
    exact("answered with a 5xx", lambda: run()["report"]["5xx"]),
    exact("answers not in OpenAI's error shape", lambda: run()["report"]["bad_shape"]),
    exact("no answer at all (reset or timeout)", lambda: run()["report"]["no_response"]),
    exact("status codes, second pass", statuses),
    exact("/health, then a valid completion, after the run",
          lambda: "{health_after}, {valid_after}".format(**run()["report"])),
    exact("engine requests opened by the second pass", lambda: run()["opened"]),
    exact("blocks in the pool after both passes", lambda: "{} of {}".format(*run()["pool"])),
    exact("the first run's five inputs now: nesting, surrogate, top_k, text/plain, 413 then "
          "the next request on that connection", first_bugs),
    exact("the greedy stream beside them: still running after the top_k case, finish reason, "
          "tokens", neighbour),
    exact("second-pass answers the frozen check accepts",
          lambda: "{} of {}".format(sum(error_shape_ok(s, b) for s, b in run()["answers"]),
                                    len(run()["answers"]))),
    exact("frozen compact cases, one per category, answered in the shape",
          frozen_cases, fmt="{} of 16".format),
    timed("run_fuzz over every case, one client, 2-core CPU", lambda: run()["fuzz_s"]),
]

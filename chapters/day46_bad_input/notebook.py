# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 46 notebook: fuzzing the front door
#
# The Day 38 server on 127.0.0.1 (a free port, a thread of this process; nanoserve-tiny,
# float32, 4 slots, a 64-block pool, the default 4 MiB body limit). On a 2-core CPU in about
# ten seconds:
#
# 1. the cases, counted by category, a few shown as the bytes they are;
# 2. all of them against the live server with `run_fuzz`, category by category;
# 3. what a refusal says, one per category;
# 4. the five inputs the first run broke, and what they get now;
# 5. the frozen compact cases and the frozen check.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import collections
import json
import socket

import httpx

from chapters.day38_server.live import live_server
from chapters.day46_bad_input.snapshot.cases import compact_cases, error_shape_ok
from nanoserve.bench.fuzz import CATEGORIES, bad_requests, run_fuzz

ctx = live_server(max_num_seqs=4, num_kv_blocks=64, block_size=4)
live = ctx.__enter__()
c = httpx.Client(base_url=live.url, timeout=60, trust_env=False)
print("serving on", live.url)

# %% [markdown]
# ## 1. The cases
#
# Every case is raw bytes plus headers, so it can be anything a socket carries. They are
# deduplicated and shuffled with the seed; the same seed always gives the same list.

# %%
vocab, ctx_len = live.engine.vocab_size, live.engine.max_model_len
cases = bad_requests(seed=46, vocab_size=vocab, max_model_len=ctx_len)
counts = collections.Counter(k.category for k in cases)
print(len(cases), "cases in", len(counts), "categories")
for name in CATEGORIES:
    print(f"  {name:24} {counts[name]:4}")
assert bad_requests(46, vocab, ctx_len) == cases  # seeded: replayable by index

# %%
shown = collections.Counter()
for k in cases:
    if shown[k.category] < 2 and k.category in ("broken_json", "nan_inf", "invalid_utf8",
                                                "huge_negative_integers", "bad_messages"):
        shown[k.category] += 1
        print(f"{k.category:24} {k.path:22} {k.body[:70]!r}")

# %% [markdown]
# ## 2. All of them, against the live server
#
# One client, one case at a time. Every answer must be a 4xx in OpenAI's error shape; then
# `/health` must be 200 and a valid completion must be served.

# %%
report = run_fuzz(live.url, cases)
print(f"{'category':24} {'sent':>5} {'4xx':>5} {'5xx':>5} {'shape':>6} {'none':>5}")
for name in CATEGORIES:
    row = report["categories"][name]
    print(f"{name:24} {row['sent']:5} {row['4xx']:5} {row['5xx']:5} {row['bad_shape']:6} "
          f"{row['no_response']:5}")
print("health after:", report["health_after"], " valid after:", report["valid_after"],
      " failures:", report["failures"])

# %% [markdown]
# ## 3. What a refusal says
#
# The first case of each category, with its status and the error object. `param` names the
# field where there is one, so a client can point at it.

# %%
first = {}
for k in cases:
    first.setdefault(k.category, k)
for name in CATEGORIES:
    k = first[name]
    r = c.post(k.path, content=k.body, headers=dict(k.headers))
    err = r.json()["error"]
    print(f"{name:24} {r.status_code} param={err['param']!s:12} {err['message'][:60]}")

# %% [markdown]
# ## 4. The first run's five inputs
#
# Deep nesting, a UTF-8-encoded surrogate and a `top_k` of `10**30` each gave a 500 (the
# last one by failing the whole engine step); a `text/plain` body was served; and a 413 left
# the connection dirty, so the next request on it was reset. Here each goes out as raw bytes,
# the 413 case followed by a valid request on the same socket.

# %%
port = int(live.url.rsplit(":", 1)[1])


def raw(body: bytes, sock=None, kind=b"application/json"):
    s = sock or socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + kind +
              b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, rest = buf.split(b"\r\n\r\n", 1)
    n = int(next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length"))
            .split(b":")[1])
    while len(rest) < n:
        rest += s.recv(65536)
    answer = json.loads(rest)
    said = answer["error"]["message"][:60] if "error" in answer else repr(
        answer["choices"][0]["text"])
    return s, head.split(b"\r\n")[0].decode(), said


for what, body, kind in [
        ("5,000 brackets", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", b"application/json"),
        ("encoded surrogate", b'{"prompt": "a\xed\xa0\x80"}', b"application/json"),
        ("top_k 10^30", json.dumps({"prompt": "a", "top_k": 10**30}).encode(),
         b"application/json"),
        ("text/plain", b'{"prompt": "The for"}', b"text/plain")]:
    s, status, message = raw(body, kind=kind)
    s.close()
    print(f"{what:18} {status}  {message}")

s, status, message = raw(json.dumps({"prompt": "a" * (5 << 20)}).encode())
print(f"{'5 MiB body':18} {status}  {message}")
s, status, text = raw(json.dumps({"prompt": "The for", "max_tokens": 3}).encode(), sock=s)
print(f"{'then, same socket':18} {status}  {text}")
s.close()

# %% [markdown]
# ## 5. The frozen cases and the frozen check
#
# `snapshot/cases.py` is the idea at its smallest: one case per category and the standard
# written out in the standard library (a 4xx, exactly the four fields, `code` equal to the
# status, no traceback).

# %%
for cat, path, headers, body in compact_cases(vocab, ctx_len):
    r = c.post(path, content=body, headers=dict(headers))
    print(f"{cat:24} {r.status_code}  shape ok: {error_shape_ok(r.status_code, r.content)}")
print(error_shape_ok(500, b'{"error": {"message": "x", "type": "E", "param": null, "code": 500}}'))

# %%
live.idle()
print("blocks free:", live.pool.num_free, "of", live.pool.num_blocks,
      "| engine requests ever opened:", live.engine.core.counters.requests_added)
c.close()
ctx.__exit__(None, None, None)
print("stopped")

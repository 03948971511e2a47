# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 39 notebook: streaming, and what happens when the client hangs up
#
# The Day 38 server on 127.0.0.1 (a free port, a thread of this process; nanoserve-tiny,
# float32, 4 slots, 256 blocks of 4 tokens). On a CPU in a few seconds:
#
# 1. one chat stream, raw, event by event;
# 2. the same request streamed and not streamed: same text, same ids, same usage;
# 3. a streaming client and a non-streaming client hang up; the engine aborts both;
# 4. `/metrics` back to exactly zero, every block home;
# 5. the frozen framing and the frozen disconnect watcher.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import asyncio
import time

import httpx

from chapters.day38_server.live import live_server
from chapters.day39_streaming_abort.snapshot.sse import (
    ClientGone,
    events,
    frame,
    until_disconnect,
)
from nanoserve.bench import run_sync

ctx = live_server(max_num_seqs=4, num_kv_blocks=256, block_size=4)
live = ctx.__enter__()
c = httpx.Client(base_url=live.url, timeout=60, trust_env=False)
print("serving on", live.url)

# %% [markdown]
# ## 1. One chat stream, raw
#
# `stream: true` turns the response into server-sent events: `data: <json>` and a blank line,
# over and over, then `data: [DONE]`. The first chat event carries only the role; each later
# one a piece of text; the last text event carries the `finish_reason`; with
# `stream_options.include_usage` a usage event with no choices comes just before `[DONE]`.

# %%
chat = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 8,
        "temperature": 0}
raw = b""
with c.stream("POST", "/v1/chat/completions",
              json={**chat, "stream": True, "stream_options": {"include_usage": True}}) as s:
    print(s.status_code, s.headers["content-type"])
    for b in s.iter_raw():
        raw += b
raw = raw.decode()
for e in events(raw):
    if e == "[DONE]":
        print("[DONE]")
    elif e["choices"]:
        ch = e["choices"][0]
        print("delta", ch["delta"], "finish_reason", ch["finish_reason"])
    else:
        print("usage", e["usage"])

# %% [markdown]
# ## 2. Streamed and not streamed
#
# The stream is the same request handed out piece by piece, so the pieces must join into the
# non-streamed answer. That holds for greedy requests and for seeded sampling alike, because a
# seeded request draws from its own generator whatever else is in the batch.

# %%
def joined(path, body):
    text, ids, usage = "", [], None
    with c.stream("POST", path, json={**body, "stream": True, "return_token_ids": True,
                                      "stream_options": {"include_usage": True}}) as s:
        buf = "".join(s.iter_text())
    for e in events(buf):
        if e == "[DONE]":
            continue
        if e["usage"]:
            usage = e["usage"]
        for ch in e["choices"]:
            text += ch.get("text") or (ch.get("delta") or {}).get("content") or ""
            ids += ch.get("token_ids") or []
    return text, ids, usage


for path, body in [
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}),
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24,
                             "temperature": 0.9, "seed": 11}),
        ("/v1/chat/completions", {**chat, "max_tokens": 16, "temperature": 0.9, "seed": 3})]:
    whole = c.post(path, json={**body, "return_token_ids": True}).json()
    ch = whole["choices"][0]
    text = ch["text"] if "text" in ch else ch["message"]["content"]
    s_text, s_ids, s_usage = joined(path, body)
    print(path, "same text:", s_text == text, "same ids:", s_ids == ch["token_ids"],
          "same usage:", s_usage == whole["usage"])
    print("   ", repr(text[:60]))

# %% [markdown]
# ## 3. Hanging up
#
# A streaming client reads three events and closes the connection; a non-streaming client gives
# up after 0.3 s. Both asked for 200 tokens with EOS ignored. The server notices each hang-up
# (the streaming one at once, the blocked one within the 50 ms watcher's poll), aborts the
# engine request, and the engine frees its blocks at the top of its next iteration.

# %%
def abort_count():
    text = c.get("/metrics").text
    line = next((ln for ln in text.splitlines()
                 if ln.startswith("nanoserve:request_success_total")
                 and 'finished_reason="abort"' in ln), None)
    return float(line.split()[-1]) if line else 0.0


before = abort_count()
body = {"prompt": [0, 20, 6, 7], "max_tokens": 200, "ignore_eos": True, "temperature": 0}
with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
    seen = 0
    for line in s.iter_lines():
        seen += line.startswith("data:")
        if seen == 3:
            break
    print("streaming client: read 3 events, running now:", live.engine.num_running,
          "blocks held:", live.pool.num_blocks - live.pool.num_free)
t = time.perf_counter()
try:
    httpx.post(live.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.3),
               trust_env=False)
except httpx.ReadTimeout:
    print("non-streaming client: gave up after", round(time.perf_counter() - t, 2), "s")
live.idle()
print("aborted engine requests:", abort_count() - before)

# %% [markdown]
# ## 4. Idle means zero
#
# The gauges are read from the engine at scrape time. With no client left, they are exactly 0,
# and every block is back in the pool.

# %%
for line in c.get("/metrics").text.splitlines():
    if line.startswith(("nanoserve:num_requests", "nanoserve:kv_cache",
                        "nanoserve:request_success_total")):
        print(line)
print("blocks free:", live.pool.num_free, "of", live.pool.num_blocks)

# %% [markdown]
# ## 5. The frozen framing and watcher
#
# `snapshot/sse.py` writes an event as compact JSON after `data: `, which is exactly what the
# server sends: re-framing the stream from section 1 reproduces it byte for byte. Its watcher
# awaits a piece of work while asking whether the client is still there, and cancels the work
# when the answer changes.

# %%
again = "".join("data: [DONE]\n\n" if e == "[DONE]" else frame(e) for e in events(raw))
print("re-framed stream identical:", again == raw, f"({len(raw.encode())} bytes)")


async def watch():
    asks = 0

    async def gone():
        nonlocal asks
        asks += 1
        return asks >= 3

    work = asyncio.ensure_future(asyncio.sleep(10))
    try:
        await until_disconnect(gone, work, poll=0.01)
    except ClientGone:
        await asyncio.sleep(0)
        return asks, work.cancelled()

print("asks, work cancelled:", run_sync(watch()))

# %%
c.close()
ctx.__exit__(None, None, None)
print("stopped")

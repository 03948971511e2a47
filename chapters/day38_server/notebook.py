# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 38 notebook: the OpenAI-compatible server, from the outside
#
# A real server on 127.0.0.1 (a free port, in a thread of this process): `build_app` over
# `AsyncLLM` over the shipped nanoserve-tiny, float32, 4 slots, a 64-block pool. On a CPU in a
# few seconds:
#
# 1. the small routes: `/health`, `/version`, `/v1/models`;
# 2. a completion and a chat completion, and their usage;
# 3. `n=3` as three engine requests;
# 4. errors in OpenAI's shape, one per status code;
# 5. `/metrics` under vLLM's names, back at zero when idle;
# 6. the frozen Day 38 app over Day 7's greedy loop, on the same prompt.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import json

import httpx

from chapters.day38_server.live import live_server
from nanoserve.bench import run_sync

KEY = "sk-notebook"
AUTH = {"Authorization": f"Bearer {KEY}"}
ctx = live_server(max_num_seqs=4, num_kv_blocks=64, block_size=4, max_waiting=4, api_key=KEY,
                  max_body_bytes=64 << 10)
live = ctx.__enter__()
c = httpx.Client(base_url=live.url, headers=AUTH, timeout=60, trust_env=False)
print("serving on", live.url)

# %% [markdown]
# ## 1. The small routes
#
# `/health` says 200 only once a warm-up token has gone through the whole path; `/v1/models`
# lists the one model, with its context length (a vLLM extension).

# %%
print(c.get("/health").json(), c.get("/version").json())
print(json.dumps(c.get("/v1/models").json(), indent=1))

# %% [markdown]
# ## 2. A completion and a chat completion
#
# Greedy (`temperature: 0`), so the text is the same every run. `usage` is counted from token
# ids: `prompt_tokens` is the encoded prompt (BOS included), `completion_tokens` the tokens the
# engine produced. `return_token_ids` (vLLM's extension) shows the ids themselves, so the count
# can be checked by hand.

# %%
r = c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8,
                                    "temperature": 0, "return_token_ids": True}).json()
ch = r["choices"][0]
print(repr(ch["text"]), ch["finish_reason"])
print("prompt ids", ch["prompt_token_ids"], "output ids", ch["token_ids"])
print("usage", r["usage"])

chat = c.post("/v1/chat/completions", json={
    "messages": [{"role": "system", "content": "You are brief."},
                 {"role": "user", "content": "Tell me a story."}],
    "max_tokens": 8, "temperature": 0}).json()
print(chat["choices"][0]["message"], chat["usage"])

# %% [markdown]
# ## 3. `n=3` is three engine requests
#
# The server opens one engine request per choice (seeds `seed`, `seed+1`, `seed+2`), all
# together, and merges their deltas. The core's counter shows three additions.

# %%
before = live.engine.core.counters.requests_added
r = c.post("/v1/completions", json={"prompt": "Once upon a time", "n": 3, "max_tokens": 6,
                                    "temperature": 0.8, "seed": 7}).json()
print("engine requests added:", live.engine.core.counters.requests_added - before)
for ch in r["choices"]:
    print(ch["index"], repr(ch["text"]))
print(r["usage"])

# %% [markdown]
# ## 4. Errors, in OpenAI's shape
#
# Every failure is `{"error": {"message", "type", "param", "code"}}` with the HTTP status as
# `code`; `param` names the field when there is one. None of these reaches the engine.

# %%
bad = [
    ("max_tokens as a string", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": "10"},
     AUTH),
    ("no API key", "POST", "/v1/completions", {"prompt": "hi"}, {"Authorization": ""}),
    ("unknown model", "POST", "/v1/completions", {"prompt": "hi", "model": "gpt-4"}, AUTH),
    ("unknown route", "GET", "/v1/engines", None, AUTH),
    ("over the body limit", "POST", "/v1/completions", {"prompt": "x" * (65 << 10)}, AUTH),
    ("n=5, max_waiting=4", "POST", "/v1/completions", {"prompt": "hi", "n": 5}, AUTH),
]
before = live.engine.core.counters.requests_added
for what, method, path, body, headers in bad:
    resp = c.request(method, path, json=body, headers=headers)
    e = resp.json()["error"]
    extra = f" Retry-After={resp.headers['retry-after']}" if resp.status_code == 429 else ""
    print(f"{what:24s} {resp.status_code} {e['type']:22s} param={e['param']}{extra}")
print("engine requests added by the errors:", live.engine.core.counters.requests_added - before)

# %% [markdown]
# ## 5. `/metrics`
#
# vLLM's names under the `nanoserve:` prefix. The gauges are read from the engine at scrape
# time, so once the server is idle they are exactly zero; the counters and histograms are
# events the server saw go by.

# %%
live.idle()
for line in c.get("/metrics").text.splitlines():
    if line.startswith("nanoserve:") and "_bucket" not in line and "_created" not in line:
        print(line)
print("blocks free:", live.pool.num_free, "of", live.pool.num_blocks)

# %% [markdown]
# ## 6. The frozen Day 38 app
#
# `snapshot/app.py` is the same contract as a bare ASGI app in the standard library: one route,
# the error shape, usage counted from ids. Over Day 7's greedy loop (no batching, no scheduler)
# it must give the same tokens as the live server, because greedy decoding of the same model is
# the same function.

# %%
from chapters.common import SHIPPED  # noqa: E402
from chapters.day01_llama_forward.snapshot.weights import load_model  # noqa: E402
from chapters.day07_kv_cache.snapshot.generate import generate_cached  # noqa: E402
from chapters.day38_server.snapshot.app import build_app  # noqa: E402

model = load_model(SHIPPED)
frozen = build_app(lambda ids, n: generate_cached(model, ids, n).token_ids, "nanoserve-tiny",
                   vocab_size=model.cfg.vocab_size,
                   max_model_len=model.cfg.max_position_embeddings)
prompt = [0, 5, 77, 300, 12, 901, 44]


async def ask(body):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=frozen),
                                 base_url="http://frozen") as fc:
        return (await fc.post("/v1/completions", json=body)).json()

old = run_sync(ask({"prompt": prompt, "max_tokens": 12}))
new = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                      "ignore_eos": True, "return_token_ids": True}).json()
print("frozen:", old["choices"][0]["token_ids"], old["usage"])
print("live:  ", new["choices"][0]["token_ids"], new["usage"])
print("frozen error:", run_sync(ask({"prompt": prompt, "max_tokens": "10"})))

# %%
c.close()
ctx.__exit__(None, None, None)
print("stopped")

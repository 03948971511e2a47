"""Day 38's numbers: one reduced run against a real server on 127.0.0.1, every count exact.

The server: ``build_app`` over ``AsyncLLM`` over the shipped nanoserve-tiny (float32), served by
uvicorn on a free port of 127.0.0.1 (``live.py``): 4 slots, a 64-block pool of block_size 4, an
API key, ``max_waiting=4`` and a 64 KiB body limit. The small routes, five generating requests
(greedy unless said), nine bad ones, seven 1-token round trips, then ``/metrics`` once idle.
The frozen Day 38 app (``snapshot/app.py``) runs over Day 7's greedy loop in-process, through
httpx's ASGI transport, on the same prompt.
"""

from __future__ import annotations

import functools
import json
import statistics
import time

from chapters.runner import exact, timed

from .live import MODEL_NAME, live_server

KEY = "sk-day38"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_LIMIT = 64 << 10
STORY = "Once upon a time"
IDS = [0, 5, 77, 300, 12, 901, 44]  # a token-id prompt for the snapshot comparison
BAD = [  # (what is wrong, method, path, json body or raw bytes, headers)
    ("max_tokens as a string", "POST", "/v1/completions",
     {"prompt": STORY, "max_tokens": "10"}, AUTH),
    ("a negative temperature", "POST", "/v1/completions",
     {"prompt": STORY, "temperature": -1}, AUTH),
    ("malformed JSON", "POST", "/v1/completions", b'{"prompt": "Once', AUTH),
    ("a prompt as long as the context", "POST", "/v1/completions",
     {"prompt": [5] * 1024, "max_tokens": 1}, AUTH),
    ("no API key", "POST", "/v1/completions", {"prompt": STORY}, {}),
    ("a model this server does not serve", "POST", "/v1/completions",
     {"prompt": STORY, "model": "gpt-4"}, AUTH),
    ("a route that does not exist", "GET", "/v1/engines", None, AUTH),
    ("a body over the 64 KiB limit", "POST", "/v1/completions",
     {"prompt": "x" * (BODY_LIMIT + 1)}, AUTH),
    ("n=5 while max_waiting is 4", "POST", "/v1/completions",
     {"prompt": STORY, "n": 5, "max_tokens": 4}, AUTH),
]


def _metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every nanoserve sample of a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("nanoserve:"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                                  if k != "model_name")
                out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


@functools.cache
def run() -> dict:
    import httpx

    r: dict = {}
    with live_server(max_num_seqs=4, num_kv_blocks=64, block_size=4, max_waiting=4,
                     api_key=KEY, max_body_bytes=BODY_LIMIT) as live:
        c = httpx.Client(base_url=live.url, timeout=60, trust_env=False)
        added = lambda: live.engine.core.counters.requests_added  # noqa: E731
        greedy = {"temperature": 0, "return_token_ids": True}
        story = c.post("/v1/completions", headers=AUTH,
                       json={"prompt": STORY, "max_tokens": 8, **greedy})
        chat = c.post("/v1/chat/completions", headers=AUTH, json={
            "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 8,
            **greedy})
        ids = c.post("/v1/completions", headers=AUTH,
                     json={"prompt": IDS, "max_tokens": 12, "ignore_eos": True, **greedy})
        a0 = added()
        three = c.post("/v1/completions", headers=AUTH, json={
            "prompt": STORY, "n": 3, "max_tokens": 6, "temperature": 0.8, "seed": 7,
            "return_token_ids": True})
        a1 = added()
        pairs = c.post("/v1/completions", headers=AUTH, json={
            "prompt": [[0, 9, 10], [0, 11, 12, 13]], "n": 2, "max_tokens": 5, **greedy})
        a2 = added()
        routes = [c.get(p).status_code for p in ("/health", "/version", "/metrics")]
        routes += [c.get("/v1/models", headers=AUTH).status_code, story.status_code,
                   chat.status_code]
        bad = []
        for _, method, path, body, headers in BAD:
            kw = {"content": body} if isinstance(body, bytes) else {"json": body}
            if body is None:
                kw = {}
            resp = c.request(method, path, headers=headers, **kw)
            bad.append((resp.status_code, resp.json(), resp.headers.get("retry-after")))
        r["bad_engine_requests"] = added() - a2
        rtts, r["rtt_usage"] = [], 0
        for _ in range(7):
            t = time.perf_counter()
            one = c.post("/v1/completions", headers=AUTH, json={"prompt": IDS, "max_tokens": 1,
                                                                "temperature": 0})
            rtts.append(time.perf_counter() - t)
            r["rtt_usage"] += one.json()["usage"]["completion_tokens"]
        r["rtt"] = statistics.median(rtts[2:])
        live.idle()
        r["metrics"] = _metrics(c.get("/metrics").text)
        r["pool"] = (live.pool.num_free, live.pool.num_blocks)
        r["routes"] = routes
        r["good"] = [x.json() for x in (story, chat, ids, three, pairs)]
        r["n3_added"], r["pairs_added"] = a1 - a0, a2 - a1
        r["bad"] = bad
        r["live_ids"] = ids.json()["choices"][0]["token_ids"]
        r["live_error"] = bad[0][1]
        c.close()
    return r


def usage_matches(resp: dict) -> bool:
    u = resp["usage"]
    prompts = ([resp["prompt_token_ids"]] if "prompt_token_ids" in resp
               and resp["prompt_token_ids"] is not None
               else [ch["prompt_token_ids"] for ch in resp["choices"]
                     if ch.get("prompt_token_ids") is not None])
    completion = sum(len(ch["token_ids"]) for ch in resp["choices"])
    prompt = sum(len(p) for p in prompts)
    if resp["object"] == "text_completion":  # one prompt per n choices: count each prompt once
        seen = {json.dumps(p) for p in prompts}
        prompt = sum(len(json.loads(p)) for p in seen)
    return (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (
        prompt, completion, prompt + completion)


@functools.cache
def snapshot_run() -> tuple[list[int], dict]:
    """The frozen app over Day 7's greedy loop: token ids for IDS, and the max_tokens error."""
    import asyncio

    import httpx

    from chapters.common import SHIPPED
    from chapters.day01_llama_forward.snapshot.weights import load_model
    from chapters.day07_kv_cache.snapshot.generate import generate_cached

    from .snapshot.app import build_app

    model = load_model(SHIPPED)
    app = build_app(lambda ids, n: generate_cached(model, ids, n).token_ids, MODEL_NAME,
                    vocab_size=model.cfg.vocab_size,
                    max_model_len=model.cfg.max_position_embeddings)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://snapshot") as c:
            ok = await c.post("/v1/completions", json={"prompt": IDS, "max_tokens": 12})
            bad = await c.post("/v1/completions", json={"prompt": IDS, "max_tokens": "10"})
            return ok.json()["choices"][0]["token_ids"], bad.json()

    return asyncio.run(go())


def _param(body: dict) -> str:
    return body["error"]["param"] or "none"


def openai_shaped() -> int:
    n = 0
    for status, body, _ in run()["bad"]:
        e = body.get("error", {})
        n += (set(body) == {"error"} and set(e) == {"message", "type", "param", "code"}
              and e["code"] == status and isinstance(e["message"], str) and e["message"] != "")
    return n


def same_ids() -> str:
    frozen, live = snapshot_run()[0], run()["live_ids"]
    return f"identical ({len(live)} tokens)" if frozen == live else "different"


def idle_gauges() -> str:
    m = run()["metrics"]
    return ", ".join(f"{m[f'nanoserve:{k}']:g}" for k in (
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"))


def generation_tokens() -> str:
    counted = run()["metrics"]["nanoserve:generation_tokens_total"]
    # every usage of the run: the five generating requests and the seven 1-token round trips
    used = sum(x["usage"]["completion_tokens"] for x in run()["good"]) + run()["rtt_usage"]
    return f"{counted:g} = {used}"


CLAIMS = [
    exact("routes answering 200: /health, /version, /metrics, /v1/models, completions, chat",
          lambda: sum(s == 200 for s in run()["routes"]), fmt="{} of 6".format),
    exact("usage of the greedy completion of 'Once upon a time', max_tokens 8",
          lambda: "{prompt_tokens} + {completion_tokens} = {total_tokens}".format(
              **run()["good"][0]["usage"])),
    exact("responses whose usage equals the token ids they return",
          lambda: sum(usage_matches(x) for x in run()["good"]), fmt="{} of 5".format),
    exact("engine requests behind one completion with n=3", lambda: run()["n3_added"]),
    exact("engine requests behind one completion with two prompts and n=2",
          lambda: run()["pairs_added"]),
    exact("bad requests answered with an OpenAI error whose code is the HTTP status",
          openai_shaped, fmt="{} of 9".format),
    exact("status codes of the nine bad requests, in order",
          lambda: ", ".join(str(s) for s, _, _ in run()["bad"])),
    exact("param named by each, in order",
          lambda: ", ".join(_param(b) for _, b, _ in run()["bad"])),
    exact("the message of the n=5 refusal", lambda: run()["bad"][-1][1]["error"]["message"]),
    exact("engine requests opened by the nine bad requests", lambda: run()["bad_engine_requests"]),
    exact("nanoserve:generation_tokens_total vs the completion tokens of every usage",
          generation_tokens),
    exact("running, waiting, KV-cache usage on /metrics once idle", idle_gauges),
    exact("blocks in the pool once idle", lambda: "{} of {}".format(*run()["pool"])),
    exact("token ids, frozen Day 38 app over Day 7's loop vs the live server", same_ids),
    exact("error body for max_tokens \"10\", frozen app vs live server",
          lambda: "identical" if snapshot_run()[1] == run()["live_error"] else "different"),
    timed("median round trip of a 1-token completion over HTTP, 2-core CPU",
          lambda: run()["rtt"], fmt=lambda s: f"{s * 1e3:.1f} ms"),
]

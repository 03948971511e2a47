"""The HTTP server against real sockets, with the official ``openai`` client.

Three servers, each a real uvicorn in a thread on a free port (``server_fixture.py``):

- ``tiny``: the shipped model, float32, with a chat template from the test (``--chat-template``
  overrides the ChatML-style one it ships);
- ``guarded``: the shipped model again with ``--api-key``, ``--max-waiting 1`` and one slot, so
  429 and 401 can be provoked deterministically, and chat goes through its own template;
- ``random``: a random Llama written by transformers (``hf_checkpoint``), no tokenizer, token ids
  in and out.

SIGTERM drain runs ``nanoserve serve`` as a subprocess. Every wait is bounded in time.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fixture import ServerThread, error_of, raw_post, read_until, wait_for

from nanoserve.async_engine import AsyncLLM
from nanoserve.entrypoints.openai.app import build_app
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
NAME = "nanoserve-tiny"
PROMPT = "The while statement"
LONG = 1000  # tokens a hung-up request would have run for: seconds on this model


@pytest.fixture(scope="module")
def tiny():
    engine = AsyncLLM.from_options(dtype="float32")
    with ServerThread(build_app(engine, NAME, chat_template=TEMPLATE)) as s:
        s.engine = engine
        yield s
    snap = engine.snapshot()
    assert snap.num_free_blocks == snap.num_blocks


@pytest.fixture(scope="module")
def guarded():
    engine = AsyncLLM.from_options(dtype="float32", max_num_seqs=1, max_waiting=1)
    with ServerThread(build_app(engine, NAME, api_key="sekrit")) as s:
        s.engine = engine
        yield s


@pytest.fixture(scope="module")
def random_model(hf_checkpoint):
    path = hf_checkpoint("gqa")
    engine = AsyncLLM.from_options(path, dtype="float32", skip_tokenizer_init=True)
    with ServerThread(build_app(engine, "random-gqa")) as s:
        s.engine, s.path = engine, path
        yield s


def client(server, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def post(server, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=60,
                      headers={"Content-Type": "application/json", **kw.pop("headers", {})},
                      **kw)


def idle(server) -> bool:
    s = server.engine.snapshot()
    return s.num_running == 0 and s.num_waiting == 0 and s.num_free_blocks == s.num_blocks


def scrape(server) -> dict[tuple, float]:
    text = httpx.get(server.url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metric(samples: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted({"model_name": NAME, **labels}.items())))
    return samples.get(key, 0.0)


# ---------------------------------------------------------------------------- small routes

def test_models_health_version(tiny):
    models = client(tiny).models.list()
    assert [m.id for m in models.data] == [NAME]
    assert httpx.get(tiny.url + "/health").status_code == 200
    assert httpx.get(tiny.url + "/version").json()["version"]
    err = error_of(httpx.get(tiny.url + "/v1/nothing-here"), 404)
    assert err["type"] == "NotFoundError"


def test_health_is_503_until_warm(random_model):
    """A second app on the same engine, its lifespan never run: not warmed, so not healthy."""
    async def get():
        app = build_app(random_model.engine, "cold")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://cold") as ac:
            return await ac.get("/health")
    assert error_of(asyncio.run(get()), 503)["type"] == "ServiceUnavailableError"


# ---------------------------------------------------------------------------- completions

def test_greedy_completion_is_llm_generate(tiny):
    """Two prompts through the server return exactly the offline API's tokens and text, and
    usage counts them exactly."""
    prompts = [PROMPT, "Lists are"]
    ref = LLM(dtype="float32").generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    r = client(tiny).completions.create(model=NAME, prompt=prompts, max_tokens=12,
                                        temperature=0, extra_body={"return_token_ids": True})
    assert [c.index for c in r.choices] == [0, 1]
    for c, out in zip(r.choices, ref, strict=True):
        assert c.token_ids == out.token_ids and c.text == out.text
        assert c.prompt_token_ids == out.prompt_token_ids
        assert c.finish_reason == out.finish_reason
    n_prompt = sum(len(o.prompt_token_ids) for o in ref)
    n_out = sum(len(o.token_ids) for o in ref)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == \
        (n_prompt, n_out, n_prompt + n_out)


def test_model_is_optional_and_defaults_to_16_tokens(tiny):
    r = post(tiny, "/v1/completions", {"prompt": [5, 6, 7], "temperature": 0,
                                       "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16


def test_stream_equals_nonstream_with_seed_and_n(tiny):
    c = client(tiny)
    kw = dict(model=NAME, prompt=PROMPT, max_tokens=10, temperature=1.0, seed=11, n=3)
    whole = c.completions.create(**kw)
    again = c.completions.create(**kw)
    texts = [ch.text for ch in sorted(whole.choices, key=lambda ch: ch.index)]
    assert texts == [ch.text for ch in sorted(again.choices, key=lambda ch: ch.index)]
    assert len(set(texts)) > 1, "seed+i should make the choices differ"
    streamed, finishes, usage = [""] * 3, [0] * 3, None
    for chunk in c.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            streamed[ch.index] += ch.text
            finishes[ch.index] += ch.finish_reason is not None
    assert streamed == texts and finishes == [1, 1, 1]
    assert usage.model_dump() == whole.usage.model_dump()
    assert whole.usage.completion_tokens == 30
    one = c.completions.create(**{**kw, "n": 1, "seed": 12})  # choice 1 drew with seed + 1
    assert one.choices[0].text == texts[1]


def test_sse_framing_ends_in_done(tiny):
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", tiny.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])


def test_logprobs(tiny):
    r = client(tiny).completions.create(model=NAME, prompt=PROMPT, max_tokens=6,
                                        temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and 3 <= len(top) <= 4
        assert top[tok] == value and value >= max(top.values()) - 1e-6  # greedy: the best


def test_stop_string_cuts_text(tiny):
    c = client(tiny)
    full = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=20, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), text
    r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=20, temperature=0,
                             stop=[stop])
    assert r.choices[0].text == text[:text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop


def test_vllm_extensions_reach_the_sampler(tiny):
    """stop_token_ids ends a reply at once; min_tokens holds that stop off; the penalties and
    min_p are accepted."""
    c = client(tiny)
    kw = dict(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0)
    first = c.completions.create(**kw, extra_body={"return_token_ids": True})
    t0 = first.choices[0].token_ids[0]
    r = c.completions.create(**kw, extra_body={"stop_token_ids": [t0],
                                               "return_token_ids": True})
    assert r.choices[0].token_ids == [t0] and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == t0
    r = c.completions.create(**kw, extra_body={"stop_token_ids": [t0], "min_tokens": 3})
    assert r.usage.completion_tokens >= 3
    r = c.completions.create(**kw, presence_penalty=0.5, frequency_penalty=0.5,
                             extra_body={"repetition_penalty": 1.3, "min_p": 0.1})
    assert r.usage.completion_tokens >= 1


# ---------------------------------------------------------------------------- chat

def test_chat(tiny):
    c = client(tiny)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt_ids = tiny.engine.tokenizer.encode(
        "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>", add_special_tokens=False)
    r = c.chat.completions.create(model=NAME, messages=messages, max_completion_tokens=8,
                                  temperature=0, logprobs=True, top_logprobs=2)
    ch = r.choices[0]
    assert ch.message.role == "assistant" and ch.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert len(ch.logprobs.content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in ch.logprobs.content)
    stream = c.chat.completions.create(model=NAME, messages=messages, max_tokens=8,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == r.usage.model_dump()
    chunks = chunks[:-1]
    assert "".join(k.choices[0].delta.content or "" for k in chunks) == ch.message.content
    assert sum(k.choices[0].finish_reason is not None for k in chunks) == 1


def test_chat_takes_response_format_from_the_official_client_and_hang_ups_free_blocks(tiny):
    """OpenAI's own ``response_format`` parameter on chat, streamed and not; a constrained
    stream the client drops is aborted and its blocks come back (the fixture checks at the
    end that every block is free)."""
    c = client(tiny)
    schema = {"type": "object", "required": ["ok", "n"], "additionalProperties": False,
              "properties": {"ok": {"type": "boolean"},
                             "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                                  "strict": True}}
    messages = [{"role": "user", "content": "Answer as JSON."}]
    r = c.chat.completions.create(model=NAME, messages=messages, max_tokens=64, temperature=0,
                                  response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    got = json.loads(r.choices[0].message.content)
    assert set(got) == {"ok", "n"} and isinstance(got["ok"], bool) and 0 <= got["n"] <= 99
    stream = c.chat.completions.create(model=NAME, messages=messages, max_tokens=64,
                                       temperature=0, response_format=fmt, stream=True)
    text = "".join(k.choices[0].delta.content or "" for k in stream if k.choices)
    assert text == r.choices[0].message.content
    long = c.chat.completions.create(  # a language that never ends: dropped after 3 chunks
        model=NAME, messages=messages, max_tokens=900, temperature=0, stream=True,
        extra_body={"structured_outputs": {"regex": "[a-z ]+"}, "ignore_eos": True})
    for i, _ in enumerate(long):
        if i == 3:
            break
    long.close()
    wait_for(lambda: tiny.engine.snapshot().num_running == 0, 30, what="the abort")


def test_chat_default_budget_is_the_context(tiny):
    r = post(tiny, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                            "temperature": 0, "ignore_eos": True,
                                            "stop_token_ids": [10]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 16  # no 16-token cap, as in vLLM


# ---------------------------------------------------------------------------- errors

@pytest.mark.parametrize("body, param", [
    ('{"prompt": "x", ', None),  # malformed JSON
    ('[1, 2]', None),  # not an object
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "max_tokens": "10"}, "max_tokens"),
    ({"prompt": "x", "n": True}, "n"),
    ({"prompt": "x", "n": 9}, "n"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [99999]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "stream": True, "prompt_logprobs": 2}, "prompt_logprobs"),  # as vLLM
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias"),  # outside the vocabulary
    ({"prompt": "x", "logit_bias": {"five": 1}}, "logit_bias"),  # not a token id
    ({"prompt": "x", "tools": [{"type": "function"}]}, "tools"),
    ({"prompt": "x", "response_format": {"type": "xml"}}, "response_format"),
    ({"prompt": "x", "response_format": {"type": "json_schema"}}, "response_format"),
    ({"prompt": "x", "structured_outputs": {"regex": "a(b"}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": {"yaml": "x"}}, "structured_outputs"),
    ({"prompt": "x", "guided_json": {"type": "object"}}, "guided_json"),
    ({"prompt": "x", "seed": 2**64}, "seed"),
    ({"prompt": "x", "top_k": 2**40}, "top_k"),
    ({"prompt": ["a"] * 300}, "prompt"),  # over 256 engine requests in one call
    ('{"prompt": ' + "[" * 5000 + "]" * 5000 + "}", None),  # nested too deeply
    (b'{"prompt": "a\xed\xa0\x80"}', None),  # not UTF-8 (an encoded surrogate)
    ('{"prompt": "a\\ud800"}', "prompt"),  # valid JSON, but no text to tokenize
    ('{"prompt": "x", "temperature": NaN}', None),
])
def test_completion_400_names_the_param(tiny, body, param):
    err = error_of(post(tiny, "/v1/completions", body), 400)
    assert err["param"] == param and err["type"] == "BadRequestError"


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({"messages": [{"role": "user", "content": None}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo"),
])
def test_chat_400_names_the_param(tiny, body, param):
    err = error_of(post(tiny, "/v1/chat/completions", body), 400)
    assert err["param"] == param


def test_non_json_content_type_is_400(tiny):
    body = json.dumps({"prompt": "x", "max_tokens": 2})
    for kind in ("text/plain", "application/jsonx", "application/x-www-form-urlencoded"):
        error_of(post(tiny, "/v1/completions", body, headers={"Content-Type": kind}), 400)
    r = post(tiny, "/v1/completions", body, headers={"Content-Type": "application/json; "
                                                                     "charset=utf-8"})
    assert r.status_code == 200, r.text


def test_unknown_fields_are_ignored_and_off_values_accepted(tiny):
    r = post(tiny, "/v1/completions", {"prompt": "x", "max_tokens": 2, "no_such_field": 1,
                                       "echo": False, "best_of": 1, "user": "u"})
    assert r.status_code == 200, r.text
    r = post(tiny, "/v1/completions", {"prompt": "x", "max_tokens": 2, "n": 2,
                                       "seed": 2**64 - 1})  # choice 1's seed wraps to 0
    assert r.status_code == 200, r.text


def test_context_limits_name_the_counts(tiny):
    limit = tiny.engine.max_model_len
    err = error_of(post(tiny, "/v1/completions", {"prompt": [7] * limit}), 400)
    assert err["param"] == "prompt" and str(limit) in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client(tiny).completions.create(model=NAME, prompt=[7] * 10, max_tokens=limit)
    assert e.value.param == "max_tokens"
    assert f"{limit} - 10" in e.value.message and str(limit) in e.value.message


def test_unknown_model_is_404(tiny):
    with pytest.raises(openai.NotFoundError) as e:
        client(tiny).completions.create(model="gpt-9", prompt="x", max_tokens=2)
    assert e.value.param == "model"


def test_body_over_limit_is_413(tiny):
    r = post(tiny, "/v1/completions", b'{"prompt": "' + b"a" * (4 << 20) + b'"}')
    assert error_of(r, 413)["type"] == "RequestEntityTooLarge"


def test_the_shipped_model_chats_through_its_own_template(guarded):
    out = client(guarded, "sekrit").chat.completions.create(
        model=NAME, messages=[{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "hi"}],
        max_tokens=2, temperature=0, extra_body={"return_token_ids": True})
    prompt = guarded.engine.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)
    assert prompt == ("<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
                      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert out.usage.prompt_tokens == len(out.prompt_token_ids)


def test_chat_without_template_is_400(tmp_path):
    """A checkpoint without a template (the shipped one, its template taken out): a 400 that
    says how to give one, never a 500."""
    import shutil

    from nanoserve.config import DEFAULT_MODEL

    folder = tmp_path / "no-template"
    shutil.copytree(DEFAULT_MODEL, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "model.safetensors").symlink_to(DEFAULT_MODEL / "model.safetensors")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    engine = AsyncLLM.from_options(folder, dtype="float32", max_num_seqs=1)
    with ServerThread(build_app(engine, NAME)) as s:
        with pytest.raises(openai.BadRequestError) as e:
            client(s).chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "--chat-template" in e.value.message and e.value.param == "messages"


def test_api_key(guarded):
    for key in ("wrong", "sekrit2"):
        with pytest.raises(openai.AuthenticationError):
            client(guarded, key).models.list()
    error_of(httpx.get(guarded.url + "/v1/models"), 401)
    assert httpx.get(guarded.url + "/health").status_code == 200  # stays open
    assert client(guarded, "sekrit").models.list().data[0].id == NAME


def test_429_when_the_queue_is_full(guarded):
    """One slot, max_waiting=1: one runs, one waits, the third is refused with Retry-After;
    a request for n=2 can never fit a queue of 1, so it is a 400, not a retry."""
    e, auth = guarded.engine, {"Authorization": "Bearer sekrit"}
    body = {"prompt": [5, 6, 7], "max_tokens": LONG, "ignore_eos": True, "stream": True}
    first = raw_post(guarded.port, "/v1/completions", body, auth)
    second = None
    try:
        wait_for(lambda: e.num_running == 1, what="the first request to run")
        with pytest.raises(openai.BadRequestError, match="max_waiting=1"):
            client(guarded, "sekrit").completions.create(model=NAME, prompt=[5], n=2,
                                                         max_tokens=2)
        second = raw_post(guarded.port, "/v1/completions", body, auth)
        wait_for(lambda: e.num_waiting == 1, what="the second request to wait")
        r = post(guarded, "/v1/completions", {"prompt": [5], "max_tokens": 2}, headers=auth)
        assert error_of(r, 429)["type"] == "RateLimitError"
        assert int(r.headers["Retry-After"]) >= 1
    finally:
        for s in (first, second):
            if s is not None:
                s.close()
    wait_for(lambda: idle(guarded), what="both hung-up requests to be aborted")


# ---------------------------------------------------------------------------- hang-ups

@pytest.mark.parametrize("stream", [True, False])
def test_hangup_aborts_the_request(tiny, stream):
    before = metric(scrape(tiny), "nanoserve:request_success_total", finished_reason="abort")
    body = {"prompt": [5, 6, 7], "max_tokens": LONG, "ignore_eos": True, "stream": stream}
    s = raw_post(tiny.port, "/v1/completions", body)
    try:
        if stream:
            assert b"data: {" in read_until(s, b"data: {")
        else:
            wait_for(lambda: tiny.engine.num_running == 1, what="the request to run")
    finally:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # linger 0: a reset, as a crashed client sends
    wait_for(lambda: idle(tiny), timeout=5, what="blocks back after the hang-up")
    after = metric(scrape(tiny), "nanoserve:request_success_total", finished_reason="abort")
    assert after == before + 1


# ---------------------------------------------------------------------------- random model

def test_random_checkpoint_token_ids(random_model):
    """A transformers-written checkpoint without a tokenizer: ids in, the offline API's ids
    out; text prompts and chat are clear 400s."""
    ids = [3, 14, 15, 92, 65]
    ref = LLM(random_model.path, dtype="float32", skip_tokenizer_init=True).generate(
        [ids], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    c = client(random_model)
    r = c.completions.create(model="random-gqa", prompt=ids, max_tokens=8, temperature=0,
                             logprobs=1, extra_body={"ignore_eos": True,
                                                     "return_token_ids": True})
    assert r.choices[0].token_ids == ref.token_ids
    assert r.choices[0].logprobs.tokens == [f"token_id:{t}" for t in ref.token_ids]
    err = error_of(post(random_model, "/v1/completions", {"prompt": "text"}), 400)
    assert err["param"] == "prompt"
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert error_of(post(random_model, "/v1/chat/completions", body), 400)["param"] == "messages"


# ---------------------------------------------------------------------------- metrics

def test_metrics_count_and_return_to_zero(tiny):
    client(tiny).completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0)
    wait_for(lambda: idle(tiny), what="idle")
    m = scrape(tiny)
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert metric(m, f"nanoserve:{gauge}") == 0.0
    assert metric(m, "nanoserve:num_preemptions_total") == 0.0
    assert metric(m, "nanoserve:prompt_tokens_total") > 0
    assert metric(m, "nanoserve:generation_tokens_total") >= 3
    assert metric(m, "nanoserve:request_success_total", finished_reason="length") >= 1
    for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds"):
        assert metric(m, f"nanoserve:{hist}_count") >= 1


def test_kv_usage_is_a_fraction_while_busy(tiny):
    body = {"prompt": [5] * 100, "max_tokens": LONG - 100, "ignore_eos": True, "stream": True}
    s = raw_post(tiny.port, "/v1/completions", body)
    try:
        read_until(s, b"data: {")
        m = scrape(tiny)
        assert metric(m, "nanoserve:num_requests_running") == 1
        assert 0 < metric(m, "nanoserve:kv_cache_usage_perc") < 1
    finally:
        s.close()
    wait_for(lambda: idle(tiny), timeout=5, what="idle")


# ---------------------------------------------------------------------------- SIGTERM

def test_sigterm_drains(tmp_path):
    """`nanoserve serve` in a subprocess: on SIGTERM a short stream finishes, the long ones still
    running or waiting at the drain timeout are aborted (and still end in [DONE]), new
    connections are refused, and it exits 0 with every block back.

    How fast the engine is must not decide the test, so the work left at the SIGTERM is far more
    than the drain timeout can cover at any speed: QUEUED long requests wait behind two slots,
    about QUEUED * LONG / 2 decode steps, against a timeout of one second."""
    queued = 12
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "nanoserve.cli", "serve", "--port", str(port),
                             "--drain-timeout", "1.0", "--max-num-seqs", "2"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            try:
                return httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                return proc.poll() is not None  # died: stop waiting, the assert says so
        wait_for(up, 60, interval=0.1, what="the server to start")
        assert proc.poll() is None
        short = {"prompt": [5, 6], "max_tokens": 8, "ignore_eos": True, "stream": True}
        long = {**short, "max_tokens": LONG}
        socks = [raw_post(port, "/v1/completions", b) for b in (short, long)]
        heads = [read_until(s, b"data: {") for s in socks]
        socks += [raw_post(port, "/v1/completions", long) for _ in range(queued)]
        heads += [b""] * queued

        def accepted():  # the long one and the queued ones (the short one may be done)
            text = httpx.get(url + "/metrics").text
            return sum(s.value for fam in text_string_to_metric_families(text)
                       for s in fam.samples if s.name in ("nanoserve:num_requests_waiting",
                                                          "nanoserve:num_requests_running")
                       ) >= 1 + queued
        wait_for(accepted, 10, what=f"{queued} more requests accepted")
        proc.send_signal(signal.SIGTERM)
        results = [b""] * len(socks)

        def rest(i):
            results[i] = heads[i] + read_until(socks[i], None, limit=1 << 24)
        readers = [threading.Thread(target=rest, args=(i,)) for i in range(len(socks))]
        for t in readers:
            t.start()
        for t in readers:
            t.join(timeout=30)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    log.seek(0)
    text = log.read()
    assert b'"finish_reason":"length"' in results[0] and b"data: [DONE]" in results[0], text
    ends = [b'"finish_reason":"abort"' in r or b'"finish_reason":"length"' in r
            for r in results[1:]]
    assert all(ends), (text, [r[-600:] for r, end in zip(results[1:], ends, strict=True)
                              if not end])
    assert any(b'"finish_reason":"abort"' in r for r in results[1:]), text  # the timeout cut,
    for r in results[1:]:
        assert b"data: [DONE]" in r  # and every stream is still well formed,
        assert r.endswith(b"\r\n0\r\n\r\n")  # chunked encoding's last chunk included
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health")
    assert "Traceback" not in text
    free = re.search(r"drained: (\d+) of (\d+) KV blocks free", text)
    assert free and free.group(1) == free.group(2), text

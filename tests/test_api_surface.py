"""The rest of the OpenAI surface clients send (issue 42): logit_bias, echo, prompt_logprobs and
``stream_options.continuous_usage_stats``, through the official ``openai`` client and raw HTTP.

What is held, on the shipped model in float32 behind a real server: a +100 ``logit_bias`` forces
its token on both endpoints and -100 bans the greedy one; ``echo`` puts the prompt's text (a
token-id prompt's decoding) before each choice's text, in a stream in each choice's first chunk,
and with ``logprobs`` the prompt tokens' entries first (the first null), streamed and whole
alike; ``prompt_logprobs`` is vLLM's shape per completions choice and once at the top of a chat
response, its entries the offline ``LLM``'s; with ``include_usage`` and
``continuous_usage_stats`` every chunk carries its choice's usage so far, and with
``include_usage`` alone only the last chunk has usage.
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_fixture import ServerThread, error_of

from nanoserve import LLM, SamplingParams
from nanoserve.async_engine import AsyncLLM
from nanoserve.entrypoints.openai.app import build_app

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
NAME = "nanoserve-tiny"
PROMPT = "Once upon a time there was"
MESSAGES = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def tiny():
    engine = AsyncLLM.from_options(dtype="float32")
    with ServerThread(build_app(engine, NAME, chat_template=TEMPLATE)) as s:
        s.engine, s.tokenizer = engine, engine.tokenizer
        yield s
    snap = engine.snapshot()
    assert snap.num_free_blocks == snap.num_blocks


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                         timeout=60)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def events(server, path: str, body: dict) -> list[dict]:
    """A stream's chunks, parsed, up to ``[DONE]``."""
    with httpx.stream("POST", server.url + path, json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        raw = r.read().decode()
    data = [e[len("data: "):] for e in raw.split("\n\n") if e]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


# ---------------------------------------------------------------------------- logit_bias

def test_logit_bias_forces_and_bans_on_both_endpoints(tiny):
    c = client(tiny)
    plain = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                                 extra_body={"return_token_ids": True})
    first = plain.choices[0].token_ids[0]
    forced = 300 if first != 300 else 301
    r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                             logit_bias={str(forced): 100},
                             extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids == [forced] * 6
    r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                             logit_bias={str(first): -100},
                             extra_body={"return_token_ids": True})
    assert first not in r.choices[0].token_ids
    chat = c.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=5,
                                     temperature=0, logit_bias={str(forced): 100},
                                     extra_body={"return_token_ids": True})
    assert chat.choices[0].token_ids == [forced] * 5


@pytest.mark.parametrize("path, base", [
    ("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": MESSAGES})])
@pytest.mark.parametrize("bias", [{"99999": 1}, {"-1": 1}, {"x": 1}, {"1.5": 2}])
def test_logit_bias_refusals_name_the_field(tiny, path, base, bias):
    err = error_of(post(tiny, path, {**base, "logit_bias": bias}), 400)
    assert err["param"] == "logit_bias"


# ---------------------------------------------------------------------------- echo

def test_echo_puts_the_prompt_first(tiny):
    c = client(tiny)
    plain = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=5, temperature=0)
    echo = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=5, temperature=0,
                                echo=True)
    assert echo.choices[0].text == PROMPT + plain.choices[0].text
    assert echo.usage.model_dump() == plain.usage.model_dump()
    ids = tiny.tokenizer.encode(PROMPT)
    by_ids = c.completions.create(model=NAME, prompt=ids, max_tokens=5, temperature=0,
                                  echo=True)
    text = tiny.tokenizer.decode(ids, skip_special_tokens=False)
    assert by_ids.choices[0].text == text + plain.choices[0].text
    two = c.completions.create(model=NAME, prompt=[PROMPT, "The"], max_tokens=3, n=2,
                               temperature=0, echo=True)
    for ch in two.choices:
        assert ch.text.startswith([PROMPT, "The"][ch.index // 2])


def test_echo_with_logprobs_puts_the_prompt_entries_first(tiny):
    c = client(tiny)
    ids = tiny.tokenizer.encode(PROMPT)
    plain = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0,
                                 logprobs=2)
    r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0,
                             logprobs=2, echo=True)
    lp, P = r.choices[0].logprobs, len(ids)
    assert len(lp.tokens) == P + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:])
    assert lp.tokens[P:] == plain.choices[0].logprobs.tokens
    # the same tokens; their logprobs agree to rounding: with echo the prefill's last row comes
    # out of a matmul over every prompt position (Engine.score), not of the last row alone
    assert lp.token_logprobs[P:] == pytest.approx(plain.choices[0].logprobs.token_logprobs,
                                                  abs=1e-4)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # vLLM asks the engine for prompt_logprobs = logprobs: the choice carries them too
    pl = r.choices[0].prompt_logprobs
    assert pl[0] is None and len(pl) == P
    for p in range(1, P):
        assert pl[p][str(ids[p])]["logprob"] == pytest.approx(lp.token_logprobs[p])


def test_echo_streams_the_prompt_in_each_choice_first_chunk(tiny):
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "n": 2,
            "echo": True, "logprobs": 1}
    whole = post(tiny, "/v1/completions", body).json()
    chunks = events(tiny, "/v1/completions", body)
    text, tokens, lps, offsets, seen = {}, {}, {}, {}, set()
    for ch in (c for e in chunks for c in e["choices"]):
        i = ch["index"]
        if i not in seen:
            assert ch["text"].startswith(PROMPT)
            seen.add(i)
        text[i] = text.get(i, "") + ch["text"]
        tokens[i] = tokens.get(i, []) + ch["logprobs"]["tokens"]
        lps[i] = lps.get(i, []) + ch["logprobs"]["token_logprobs"]
        offsets[i] = offsets.get(i, []) + ch["logprobs"]["text_offset"]
    for ch in whole["choices"]:
        i = ch["index"]
        assert text[i] == ch["text"]
        assert tokens[i] == ch["logprobs"]["tokens"]
        assert lps[i] == ch["logprobs"]["token_logprobs"]
        assert offsets[i] == ch["logprobs"]["text_offset"]


def test_echo_on_chat_is_refused(tiny):
    err = error_of(post(tiny, "/v1/chat/completions", {"messages": MESSAGES, "echo": True}),
                   400)
    assert err["param"] == "echo"


# ---------------------------------------------------------------------------- prompt_logprobs

def test_prompt_logprobs_on_both_endpoints_are_the_engine_s(tiny):
    ids = tiny.tokenizer.encode(PROMPT)
    r = post(tiny, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "n": 2,
                                       "prompt_logprobs": 3})
    assert r.status_code == 200, r.text
    with LLM(dtype="float32") as llm:
        want = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=3))[0]
    for ch in r.json()["choices"]:
        pl = ch["prompt_logprobs"]
        assert pl[0] is None and len(pl) == len(ids)
        for p in range(1, len(ids)):
            e = want.prompt_logprobs[p]
            entry = pl[p][str(ids[p])]
            assert entry["logprob"] == pytest.approx(e.logprob, abs=1e-5)
            assert entry["rank"] == e.rank
            assert entry["decoded_token"] == tiny.tokenizer.decode([ids[p]],
                                                                   skip_special_tokens=False)
            tops = {int(t) for t, v in pl[p].items() if v["rank"] <= 3}
            assert {t for t, _ in e.top} <= tops
    chat = post(tiny, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2,
                                               "prompt_logprobs": 1}).json()
    pl = chat["prompt_logprobs"]  # vLLM: once, at the top of the response
    assert pl[0] is None and len(pl) == chat["usage"]["prompt_tokens"]
    assert all(len(d) in (1, 2) for d in pl[1:])
    plain = post(tiny, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}).json()
    assert plain["prompt_logprobs"] is None


@pytest.mark.parametrize("path, base", [
    ("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": MESSAGES})])
@pytest.mark.parametrize("extra", [{"prompt_logprobs": -1}, {"prompt_logprobs": 21},
                                   {"prompt_logprobs": 2, "stream": True}])
def test_prompt_logprobs_refusals_name_the_field(tiny, path, base, extra):
    err = error_of(post(tiny, path, {**base, **extra}), 400)
    assert err["param"] == "prompt_logprobs"


# ---------------------------------------------------------------------------- usage in streams

@pytest.mark.parametrize("path, base", [
    ("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": MESSAGES})])
def test_continuous_usage_stats_put_usage_on_every_chunk(tiny, path, base):
    body = {**base, "model": NAME, "max_tokens": 6, "n": 2, "temperature": 0,
            "ignore_eos": True}
    whole = post(tiny, path, body).json()
    chunks = events(tiny, path, {**body, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}})
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    prompt = whole["usage"]["prompt_tokens"]  # one prompt, counted once for n choices
    so_far = {0: 0, 1: 0}
    for e in chunks[:-1]:
        u, (ch,) = e["usage"], e["choices"]
        assert u["prompt_tokens"] == prompt
        assert u["total_tokens"] == prompt + u["completion_tokens"]
        assert u["completion_tokens"] >= so_far[ch["index"]]  # counts up, per choice
        so_far[ch["index"]] = u["completion_tokens"]
    assert so_far == {0: 6, 1: 6}
    only_last = events(tiny, path, {**body, "stream_options": {"include_usage": True}})
    assert [e["usage"] is not None for e in only_last] == [False] * (len(only_last) - 1) + [True]
    assert only_last[-1]["usage"] == whole["usage"]
    # continuous_usage_stats without include_usage: no usage at all (vLLM's reading)
    neither = events(tiny, path, {**body, "stream_options": {"continuous_usage_stats": True}})
    assert all(e["usage"] is None for e in neither)


def test_continuous_usage_through_the_official_client(tiny):
    stream = client(tiny).chat.completions.create(
        model=NAME, messages=MESSAGES, max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    usages = [chunk.usage for chunk in stream]
    assert all(u is not None for u in usages)
    assert usages[0].completion_tokens == 0 and usages[-1].completion_tokens <= 4

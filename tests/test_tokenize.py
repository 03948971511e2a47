"""``/tokenize`` and ``/detokenize`` (vLLM's shapes) against real sockets.

Two servers, each a real uvicorn in a thread on a free 127.0.0.1 port (``server_fixture.py``):
the shipped model with a chat template and an API key, and a random transformers checkpoint
loaded without a tokenizer. The ids must be exactly the tokenizer's own, the chat form exactly
what ``/v1/chat/completions`` feeds the engine, and every bad input a 4xx in OpenAI's error
shape that names its field. Neither route opens an engine request.
"""

from __future__ import annotations

import copy
import json

import httpx
import pytest
from server_fixture import ServerThread, error_of

from nanoserve.async_engine import AsyncLLM
from nanoserve.entrypoints.openai.app import build_app

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
NAME = "nanoserve-tiny"
KEY = {"Authorization": "Bearer sekrit"}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
TEXTS = ["The while statement", "naïve café 😀, twice: 😀😀", "two\nlines\tand  spaces ", ""]


@pytest.fixture(scope="module")
def tiny():
    engine = AsyncLLM.from_options(dtype="float32")
    with ServerThread(build_app(engine, NAME, api_key="sekrit", chat_template=TEMPLATE)) as s:
        s.engine = engine
        s.tokenizer = copy.copy(engine.tokenizer)  # the tokenizer as this app sees it
        s.tokenizer.chat_template = TEMPLATE
        yield s


@pytest.fixture(scope="module")
def random_model(hf_checkpoint):
    engine = AsyncLLM.from_options(hf_checkpoint("gqa"), dtype="float32",
                                   skip_tokenizer_init=True)
    with ServerThread(build_app(engine, "random-gqa")) as s:
        s.engine = engine
        yield s


def post(server, path: str, body, headers=KEY) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=60,
                      headers={"Content-Type": "application/json", **headers})


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


# ---------------------------------------------------------------------------- the text form

@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_the_tokenizers_and_round_trip(tiny, text):
    tok = tiny.tokenizer
    got = ok(post(tiny, "/tokenize", {"model": NAME, "prompt": text}))
    assert set(got) == {"count", "max_model_len", "tokens", "token_strs"}
    assert got["tokens"] == tok.encode(text) and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == tiny.engine.max_model_len and got["token_strs"] is None
    bare = ok(post(tiny, "/tokenize", {"prompt": text, "add_special_tokens": False}))
    assert bare["tokens"] == tok.encode(text, add_special_tokens=False)
    assert ok(post(tiny, "/detokenize", {"tokens": bare["tokens"]}))["prompt"] == text
    back = ok(post(tiny, "/detokenize", {"model": NAME, "tokens": got["tokens"]}))["prompt"]
    assert back == tok.decode(got["tokens"], skip_special_tokens=False)  # BOS kept, as vLLM
    assert back == (tok.bos_token if got["tokens"][:1] == [tok.bos_token_id] else "") + text


def test_token_strs_are_the_tokenizers_own(tiny):
    got = ok(post(tiny, "/tokenize", {"prompt": TEXTS[1], "return_token_strs": True}))
    assert got["token_strs"] == [tiny.tokenizer.tok.id_to_token(t) for t in got["tokens"]]
    assert len(got["token_strs"]) == got["count"]


def test_a_prompt_longer_than_the_context_is_counted_not_refused(tiny):
    got = ok(post(tiny, "/tokenize", {"prompt": "word " * 1500}))
    assert got["count"] == len(got["tokens"]) > got["max_model_len"]


def test_tokenizing_opens_no_engine_request(tiny):
    before = tiny.engine.core.counters.requests_added
    ok(post(tiny, "/tokenize", {"prompt": "x"}))
    ok(post(tiny, "/tokenize", {"messages": MESSAGES}))
    ok(post(tiny, "/detokenize", {"tokens": [5, 6, 7]}))
    assert tiny.engine.core.counters.requests_added == before


# ---------------------------------------------------------------------------- the chat form

@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_form_is_the_chat_template(tiny, add_generation_prompt):
    got = ok(post(tiny, "/tokenize", {"messages": MESSAGES,
                                      "add_generation_prompt": add_generation_prompt}))
    want = tiny.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=add_generation_prompt,
                                              tokenize=True)
    assert got["tokens"] == want and got["count"] == len(want)
    text = tiny.tokenizer.apply_chat_template(MESSAGES,
                                              add_generation_prompt=add_generation_prompt)
    assert ok(post(tiny, "/detokenize", {"tokens": got["tokens"]}))["prompt"] == text


def test_chat_form_counts_what_chat_completions_runs(tiny):
    count = ok(post(tiny, "/tokenize", {"messages": MESSAGES}))["count"]
    r = ok(post(tiny, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1}))
    assert r["usage"]["prompt_tokens"] == count


def test_chat_form_add_special_tokens_puts_bos_on_top(tiny):
    got = ok(post(tiny, "/tokenize", {"messages": MESSAGES, "add_special_tokens": True}))
    text = tiny.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert got["tokens"] == tiny.tokenizer.encode(text)
    assert got["tokens"][0] == tiny.tokenizer.bos_token_id


# ---------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "x", "return_token_strs": 1}, 400, "return_token_strs"),
    ("/tokenize", '{"prompt": "a\\ud800"}', 400, "prompt"),
    ("/tokenize", '{"prompt": "x", ', 400, None),
    ("/tokenize", "[1, 2]", 400, None),
    ("/tokenize", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, 400, "messages"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages"),
    ("/tokenize", {"messages": MESSAGES, "model": "gpt-9"}, 404, "model"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, 400,
     "continue_final_message"),
    ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ 1 }}"}, 400, "chat_template"),
    ("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1.5]}, 400, "tokens"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens"),
    ("/detokenize", {"tokens": [5, 2048]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": [5], "model": "gpt-9"}, 404, "model"),
])
def test_bad_input_names_the_param(tiny, path, body, status, param):
    err = error_of(post(tiny, path, body), status)
    assert err["param"] == param


def test_off_values_and_unknown_fields_are_fine(tiny):
    ok(post(tiny, "/tokenize", {"messages": MESSAGES, "continue_final_message": False,
                                "chat_template": None, "tools": [], "no_such_field": 1}))
    ok(post(tiny, "/tokenize", {"prompt": "x", "echo": True}))  # not a generation field here


def test_the_api_key_guards_both_routes(tiny):
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [5]})):
        assert error_of(post(tiny, path, body, headers={}), 401)["type"] == "AuthenticationError"
        error_of(post(tiny, path, body, headers={"Authorization": "Bearer wrong"}), 401)
    assert error_of(httpx.get(tiny.url + "/tokenize", headers=KEY), 405)


def test_a_server_without_a_tokenizer_refuses(random_model):
    for path, body, param in (("/tokenize", {"prompt": "x"}, "prompt"),
                              ("/tokenize", {"messages": MESSAGES}, "messages"),
                              ("/detokenize", {"tokens": [5, 6]}, "tokens")):
        err = error_of(post(random_model, path, body, headers={}), 400)
        assert err["param"] == param and "tokenizer" in err["message"]
    assert error_of(post(random_model, "/tokenize", {"prompt": "x", "model": "nope"},
                         headers={}), 404)["param"] == "model"

"""A refusal's ``param`` comes from the check that refused, never from the words it used.

Every check below the HTTP layer (the door check on prompt ids, ``SamplingParams``, the pool's
``KVCacheManager.check_fits``) raises ``InvalidRequest`` with the field it is about. Here each of
them is made to say "completely different words" instead, and the server must still answer the same
400 with the same ``param``, renamed to the endpoint's wire name where the endpoint has its own
(chat's ``top_logprobs`` and ``max_completion_tokens``). A stricter check, in the new words, is
named the same way. The server is real (uvicorn on 127.0.0.1, a free port) and every wait is
bounded.
"""

from __future__ import annotations

import httpx
import pytest
from server_fixture import ServerThread, wait_for

import nanoserve.engine.core
import nanoserve.entrypoints.openai.parsing
from nanoserve.async_engine import AsyncLLM
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.entrypoints.openai.app import build_app
from nanoserve.sampling.params import SamplingParams
from nanoserve.validation import InvalidRequest

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
WORDS = "completely different words"
CHAT = [{"role": "user", "content": "Hi"}]
POOL_TOKENS = 8 * 16  # num_kv_blocks x block_size: a budget past this could never run


@pytest.fixture(scope="module")
def server():
    engine = AsyncLLM.from_options(dtype="float32", num_kv_blocks=8, block_size=16)
    with ServerThread(build_app(engine, "tiny", chat_template=TEMPLATE)) as s:
        s.engine = engine
        yield s
    snap = engine.snapshot()
    assert snap.num_free_blocks == snap.num_blocks


def reworded(fn):
    """``fn``, refusing what it refused with the same param and value, in other words."""
    def check(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InvalidRequest as e:
            raise InvalidRequest(WORDS, e.param, e.value) from None
    return check


@pytest.fixture
def rewording(monkeypatch):
    """Every engine-side check of a request, at each place it is called from, reworded."""
    for owner, name in ((nanoserve.entrypoints.openai.parsing, "check_prompt_ids"),
                        (nanoserve.engine.core, "check_prompt_ids"),
                        (KVCacheManager, "check_fits"),
                        (SamplingParams, "__post_init__"), (SamplingParams, "check_vocab")):
        monkeypatch.setattr(owner, name, reworded(getattr(owner, name)))


def refusal(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "BadRequestError"
    wait_for(lambda: server.engine.num_running == 0 and server.engine.num_waiting == 0,
             what="nothing left running")
    return err


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": [99999]}, "prompt"),  # outside the vocabulary
    ("/v1/completions", {"prompt": [7] * 1024}, "prompt"),  # no position left to generate
    ("/v1/completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, "stop"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [99999]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": [5, 6], "max_tokens": POOL_TOKENS}, "max_tokens"),  # pool
    ("/v1/chat/completions", {"messages": CHAT, "min_tokens": 5, "max_completion_tokens": 2},
     "min_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "stop_token_ids": [99999]}, "stop_token_ids"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 3000}]},
     "messages"),
])
def test_reworded_refusals_keep_their_param(server, rewording, path, body, param):
    err = refusal(server, path, body)
    assert err["message"] == WORDS  # the reworded check refused it, not something else
    assert err["param"] == param


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature"),  # pydantic's
    ("/v1/completions", {"prompt": [5, 6], "max_tokens": 2000}, "max_tokens"),  # the context
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 2000},
     "max_completion_tokens"),
])
def test_refusals_before_the_engine_keep_their_param(server, rewording, path, body, param):
    assert refusal(server, path, body)["param"] == param


def test_a_stricter_check_in_new_words_is_named_by_its_param(server, monkeypatch):
    """A check that refuses more than today's (logprobs above 1, temperature above 1.5,
    max_tokens above 100), worded nothing like today's: the 400 names the endpoint's field."""
    plain = SamplingParams.__post_init__

    def stricter(self) -> None:
        plain(self)
        for name, limit in (("logprobs", 1), ("temperature", 1.5), ("max_tokens", 100)):
            value = getattr(self, name)
            if value is not None and value > limit:
                raise InvalidRequest(WORDS, name, value)

    monkeypatch.setattr(SamplingParams, "__post_init__", stricter)
    for path, body, param in [
        ("/v1/completions", {"prompt": "x", "logprobs": 2}, "logprobs"),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 2},
         "top_logprobs"),
        ("/v1/completions", {"prompt": "x", "temperature": 1.8}, "temperature"),
        ("/v1/chat/completions", {"messages": CHAT, "temperature": 1.8}, "temperature"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 150}, "max_tokens"),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 150}, "max_tokens"),
        ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 150},
         "max_completion_tokens"),
    ]:
        err = refusal(server, path, body)
        assert (err["message"], err["param"]) == (WORDS, param), (path, body)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2,
                                                         "logprobs": 1}, timeout=60)
    assert r.status_code == 200, r.text  # inside the stricter limits: served as before

"""Tool calling and reasoning on /v1/chat/completions, with the official client, over a real server.

Servers, each the shipped model in float32 on a real uvicorn (``server_fixture.py``), greedy:

- ``plain``: no tool flags. Forced calls (``tool_choice: "required"`` and a named function)
  need none: the grammar makes the call, so every tool of ``tool_schemas.TOOLS`` is called both
  ways, whole and streamed, and the arguments validate with ``jsonschema``; the refusals;
  ``"auto"`` refused with vLLM's message;
- ``hermes``: ``--enable-auto-tool-choice --tool-call-parser hermes``. The tiny model never
  writes ``<tool_call>`` by itself, so a ``structured_outputs`` regex makes it write Hermes'
  format (a well-formed call, two calls, broken JSON, an unknown function) and the parser must
  read it: calls, or plain content when the text is not a call; and a named choice;
- ``thinker``: the same with ``--reasoning-parser qwen3``: a regex writes
  ``<think>...</think>answer``, and ``<think>...</think>`` before a call (a ``<tool_call>``
  inside the thinking must stay thinking); a forced call may think first.

And ``nanoserve serve --enable-auto-tool-choice --tool-call-parser hermes`` as a child process,
answering a named tool_choice. A stream joined always equals the whole response (ids aside).
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_fixture import ServerThread, error_of
from tool_schemas import MESSAGES, NAMES, TOOLS, joined, named, pick, valid, whole

from nanoserve.async_engine import AsyncLLM
from nanoserve.bench.local_server import local_server
from nanoserve.config.engine import DEFAULT_MODEL
from nanoserve.entrypoints.openai.app import build_app

NAME = "nanoserve-tiny"
GREEDY = dict(temperature=0, max_completion_tokens=160)
FEW = pick("get_weather", "get_time", "set_alarm")  # what most requests list
HERMES_CALL = (r'<tool_call>\{"name":"get_weather","arguments":\{"city":"(Paris|Rome)"\}\}'
               r'</tool_call>')


def serve(**tooling):
    engine = AsyncLLM.from_options(dtype="float32")
    with ServerThread(build_app(engine, NAME, **tooling)) as s:
        s.engine = engine
        s.client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0,
                                 timeout=60)
        yield s
    snap = engine.snapshot()
    assert snap.num_free_blocks == snap.num_blocks  # every block back after the drain


@pytest.fixture(scope="module")
def plain():
    yield from serve()


@pytest.fixture(scope="module")
def hermes():
    yield from serve(enable_auto_tool_choice=True, tool_call_parser="hermes")


@pytest.fixture(scope="module")
def thinker():
    yield from serve(enable_auto_tool_choice=True, tool_call_parser="hermes",
                     reasoning_parser="qwen3")


def both(server, **kw) -> tuple[dict, dict]:
    """The same request whole and streamed: (whole, joined stream)."""
    kw = {"model": NAME, "messages": MESSAGES, **GREEDY, **kw}
    r = server.client.chat.completions.create(**kw)
    s = server.client.chat.completions.create(stream=True, **kw)
    return whole(r.choices[0]), joined(s)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": NAME, **body}, timeout=60)


# ---------------------------------------------------------------------------- forced calls

@pytest.mark.parametrize("tool", NAMES)
@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_forced_call_validates_whole_and_streamed(plain, tool, choice):
    tc = named(tool) if choice == "named" else "required"
    other = NAMES[(NAMES.index(tool) + 1) % len(NAMES)]  # a named choice has one to ignore
    tools = pick(tool, other) if choice == "named" else pick(tool)
    got, streamed = both(plain, tools=tools, tool_choice=tc, parallel_tool_calls=False)
    assert got == streamed
    assert got["content"] is None and got["reasoning"] is None
    assert got["finish_reason"] == "tool_calls"
    assert len(got["calls"]) == 1
    name, arguments = got["calls"][0]
    assert name == tool
    assert valid(tool, arguments), arguments


def test_required_validates_for_every_tool(plain):
    """The figure the book quotes: of the eight tools, each forced alone by "required", the
    fraction whose call validated against its schema (8/8). Then "required" among four at a
    time: the call names one of them, and validates too."""
    ok = []
    for tool in NAMES:
        r = plain.client.chat.completions.create(
            model=NAME, messages=MESSAGES, tools=pick(tool), tool_choice="required",
            parallel_tool_calls=False, **GREEDY)
        calls = r.choices[0].message.tool_calls
        ok.append(len(calls) == 1 and valid(tool, calls[0].function.arguments))
    assert sum(ok) / len(ok) == 1.0, dict(zip(NAMES, ok, strict=True))
    for four in (NAMES[:4], NAMES[4:]):  # no budget: the rest of the context (~150 tokens)
        r = plain.client.chat.completions.create(
            model=NAME, messages=MESSAGES, tools=pick(*four), tool_choice="required",
            parallel_tool_calls=False, temperature=0)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name in four and valid(call.function.name,
                                                    call.function.arguments)


def test_a_call_cut_by_length_is_content(plain):
    """Whole, a call ``max_tokens`` cut short is no call: its text is content and the reason
    stays "length". A stream cannot take back the call it opened at the ``{`` (tool_parsers/
    forced.py says so), so there the call stays open, its arguments that same text."""
    got, streamed = both(plain, tools=FEW, tool_choice=named("set_alarm"),
                         max_completion_tokens=5)
    assert got["finish_reason"] == streamed["finish_reason"] == "length"
    assert got["calls"] == [] and got["content"].startswith("{")
    assert streamed["content"] is None and streamed["calls"] == [("set_alarm", got["content"])]


def test_logprobs_and_token_ids_ride_with_the_call(plain):
    """Each engine delta's logprobs and token ids go out on its own chunk, even while the
    parser holds its text back: joined, they are the whole response's, for each of n=2; with
    continuous usage every event carries its choice's usage."""
    kw = dict(model=NAME, messages=MESSAGES, tools=FEW, tool_choice=named("set_alarm"),
              logprobs=True, n=2, extra_body={"return_token_ids": True}, **GREEDY)
    r = plain.client.chat.completions.create(**kw)
    chunks = list(plain.client.chat.completions.create(
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},
        **kw))
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert all(ch.usage is not None for ch in chunks)  # continuous: on every event
    for c in r.choices:
        mine = [ch for ch in chunks if ch.choices and ch.choices[0].index == c.index]
        ids = [t for ch in mine for t in (getattr(ch.choices[0], "token_ids", None) or [])]
        lps = [lp.token for ch in mine if ch.choices[0].logprobs
               for lp in ch.choices[0].logprobs.content]
        assert ids == c.token_ids and lps == [lp.token for lp in c.logprobs.content]
        assert len(ids) == r.usage.completion_tokens // 2
        assert joined(mine) == whole(c) and c.message.tool_calls[0].function.name == "set_alarm"


def test_none_answers_in_text(plain):
    got, streamed = both(plain, tools=FEW, tool_choice="none", max_completion_tokens=8)
    assert got == streamed
    assert got["calls"] == [] and got["content"] and got["finish_reason"] == "length"


# ---------------------------------------------------------------------------- refusals

TOOL = TOOLS[0]


@pytest.mark.parametrize("body,param", [
    ({"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]},
     "tools"),  # no name
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "banana"}}}}}],
      "tool_choice": "required"}, "tools"),  # not a JSON schema
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "string"}}}], "tool_choice": "none"}, "tools"),  # not an object's schema
    ({"tools": [TOOL, TOOL], "tool_choice": "required"}, "tools"),  # one name twice
    ({"tools": [TOOL], "tool_choice": named("launch_rocket")}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": named("get_weather")}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),  # two grammars
    ({"tools": [TOOL], "tool_choice": named("get_weather"),
      "structured_outputs": {"regex": "a"}}, "structured_outputs"),
])
def test_bad_tools_are_400_naming_the_field(plain, body, param):
    err = error_of(post(plain, "/v1/chat/completions", {"messages": MESSAGES, **body}), 400)
    assert err["param"] == param, err


@pytest.mark.parametrize("body", [{"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": "auto"}])
def test_auto_without_the_flags_is_400_naming_both(plain, body):
    err = error_of(post(plain, "/v1/chat/completions", {"messages": MESSAGES, **body}), 400)
    assert err["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in err["message"]
    assert "--tool-call-parser" in err["message"]


def test_tools_on_completions_is_400(plain):
    err = error_of(post(plain, "/v1/completions", {"prompt": "x", "tools": [TOOL]}), 400)
    assert err["param"] == "tools"


def test_the_client_hears_the_refusal(plain):
    with pytest.raises(openai.BadRequestError) as e:
        plain.client.chat.completions.create(model=NAME, messages=MESSAGES, tools=[TOOL],
                                             tool_choice=named("nope"))
    assert e.value.body["param"] == "tool_choice"


# ---------------------------------------------------------------------------- auto (hermes)

def regex(pattern: str) -> dict:
    return {"extra_body": {"structured_outputs": {"regex": pattern}}}


def test_auto_reads_a_hermes_call(hermes):
    got, streamed = both(hermes, tools=FEW, **regex(HERMES_CALL))
    assert got == streamed
    assert got["content"] is None and got["finish_reason"] == "tool_calls"
    ((name, arguments),) = got["calls"]
    assert name == "get_weather" and json.loads(arguments)["city"] in ("Paris", "Rome")


def test_auto_with_parallel_false_keeps_the_first_call(hermes):
    two = HERMES_CALL + r'<tool_call>\{"name":"get_time","arguments":\{\}\}</tool_call>'
    got, streamed = both(hermes, tools=FEW, **regex(two))
    assert got == streamed and [n for n, _ in got["calls"]] == ["get_weather", "get_time"]
    got, streamed = both(hermes, tools=FEW, parallel_tool_calls=False, **regex(two))
    assert got == streamed and [n for n, _ in got["calls"]] == ["get_weather"]


@pytest.mark.parametrize("pattern,text", [
    (r'<tool_call>\{broken', '<tool_call>{broken'),
    (r'<tool_call>\{"name":"launch_rocket","arguments":\{\}\}</tool_call>',
     '<tool_call>{"name":"launch_rocket","arguments":{}}</tool_call>'),
])
def test_malformed_calls_are_plain_content(hermes, pattern, text):
    got, streamed = both(hermes, tools=FEW, **regex(pattern))
    assert got == streamed
    assert got == {"content": text, "reasoning": None, "reasoning_content": None,
                   "calls": [], "finish_reason": "stop"}


def test_a_named_choice_on_the_auto_server(hermes):
    got, streamed = both(hermes, tools=FEW, tool_choice=named("set_alarm"))
    assert got == streamed and got["finish_reason"] == "tool_calls"
    ((name, arguments),) = got["calls"]
    assert name == "set_alarm" and valid(name, arguments)


def test_the_cli_serves_a_named_choice():
    with local_server(DEFAULT_MODEL, dtype="float32", timeout_s=120, extra_args=(
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0,
                               timeout=60)
        r = client.chat.completions.create(model=NAME, messages=MESSAGES, tools=FEW,
                                           tool_choice=named("get_weather"), **GREEDY)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    assert call.function.name == "get_weather" and valid("get_weather", call.function.arguments)


# ---------------------------------------------------------------------------- reasoning

def test_reasoning_is_split_from_the_answer(thinker):
    got, streamed = both(thinker, **regex(r"<think>(let me see|hmm)</think>(yes|no)"))
    assert got == streamed
    assert got["reasoning"] in ("let me see", "hmm")
    assert got["reasoning_content"] == got["reasoning"]
    assert got["content"] in ("yes", "no") and got["finish_reason"] == "stop"


def test_tool_calls_are_read_only_after_the_thinking(thinker):
    got, streamed = both(thinker, tools=FEW, **regex(
        r"<think>maybe <tool_call>no</think>" + HERMES_CALL))
    assert got == streamed
    assert got["reasoning"] == got["reasoning_content"] == "maybe <tool_call>no"
    assert got["content"] is None and got["finish_reason"] == "tool_calls"
    assert [n for n, _ in got["calls"]] == ["get_weather"]


def test_a_forced_call_may_think_first(thinker):
    """The forced call's grammar opens with room to think (qwen3: an optional
    ``<think>...</think>``); what the model writes there is reasoning, and the call after it is
    read and valid. On these prompts the tiny model writes no thinking; on others it opens
    ``<think>`` and never closes it, so it makes no call before ``max_tokens``: the thinking is
    unbounded, as it is in vLLM, which constrains only what follows it."""
    got, streamed = both(thinker, tools=pick("get_time"), tool_choice="required",
                         parallel_tool_calls=False)
    assert got == streamed and got["finish_reason"] == "tool_calls"
    assert got["content"] is None and got["reasoning"] == got["reasoning_content"]
    assert got["calls"] == [("get_time", "{}")]
    got, streamed = both(thinker, tools=pick("book_flight", "get_time"),
                         tool_choice=named("book_flight"))
    assert got == streamed and got["finish_reason"] == "tool_calls" and got["content"] is None
    ((name, arguments),) = got["calls"]
    assert name == "book_flight" and valid(name, arguments), arguments

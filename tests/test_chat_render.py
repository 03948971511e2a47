"""Rendering a chat history with tools: the templates, the renderer, and /tokenize's chat form.

Four kinds of check, none resting on our renderer alone:

- byte identity: every family's template, and the shipped model's, renders a history without
  tools exactly as the template of before tools (frozen below) did, over hundreds of seeded
  random histories (the chapters' recorded prompts depend on it), errors included;
- transformers: for each family the random tokenizer (``write_tokenizer``) is loaded by
  transformers' ``PreTrainedTokenizerFast`` too, and its ``apply_chat_template`` with tools, tool
  calls (arguments as dicts), tool results, reasoning and ``enable_thinking`` gives our string;
- the published formats, written out by hand here from each family's documentation (the
  Hermes tags, Llama's ``parameters`` JSON and ``ipython`` turns, Mistral's markers);
- the server: ``/tokenize`` with tools and ``chat_template_kwargs`` gives the template's ids,
  and a history whose call arguments are not a JSON object is a 400 naming ``messages``.
"""

from __future__ import annotations

import ast
import copy
import json
import random
from pathlib import Path

import httpx
import pytest
from server_fixture import ServerThread, error_of

from nanoserve.entrypoints.openai.chat_render import chat_messages, template_vars
from nanoserve.entrypoints.openai.errors import ApiError
from nanoserve.entrypoints.openai.protocol import ChatMessage, ToolDefinition
from nanoserve.testing import CHAT_TEMPLATES, write_tokenizer
from nanoserve.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "nanoserve" / "checkpoints" / "nanoserve-tiny"
DATE = {"date_string": "26 Jul 2024"}  # Llama's header: a fixed day, not today's

# ---------------------------------------------------------------------------- before tools
# The templates as they were before tools existed (commit 693ad7e), frozen.
_OLD_ALTERNATE = ("{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{- raise_exception('conversation roles must alternate "
              "user/assistant/user/assistant/...') }}{%- endif %}\n")
_OLD_CHATML = ("{%- for message in messages %}\n"
           "{{- '<|im_start|>' + message['role'] + '\\n' }}\n"
           "{{- message['content'] + '<|im_end|>\\n' }}\n"
           "{%- endfor %}\n"
           "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n")
OLD_TEMPLATES: dict[str, str] = {
    "qwen2": _OLD_CHATML,
    "qwen3": _OLD_CHATML,
    "llama": (
        "{{- bos_token }}\n"
        "{%- if messages and messages[0]['role'] == 'system' %}\n"
        "{%- set system, turns = messages[0]['content'] | trim, messages[1:] %}\n"
        "{%- else %}{%- set system, turns = '', messages %}{%- endif %}\n"
        "{%- set today = date_string if date_string is defined else strftime_now('%d %b %Y') %}\n"
        "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
        "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + today + '\\n\\n' }}\n"
        "{{- system + '<|eot_id|>' }}\n"
        "{%- for message in turns %}\n"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
        "{{- message['content'] | trim + '<|eot_id|>' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n"),
    "mistral": (
        "{{- bos_token }}\n"
        "{%- for message in messages %}\n"
        "{%- if message['role'] not in ['user', 'assistant'] %}\n"
        "{{- raise_exception('the ' + message['role'] + ' role is not supported: this model "
        "takes user and assistant messages only') }}{%- endif %}\n" + _OLD_ALTERNATE +
        "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}\n"
        "{%- else %}{{- message['content'] + eos_token }}{%- endif %}\n"
        "{%- endfor %}\n"),
    "gemma3": (
        "{{- bos_token }}\n"
        "{%- if messages and messages[0]['role'] == 'system' %}\n"
        "{%- set lead, turns = messages[0]['content'] + '\\n\\n', messages[1:] %}\n"
        "{%- else %}{%- set lead, turns = '', messages %}{%- endif %}\n"
        "{%- for message in turns %}\n" + _OLD_ALTERNATE +
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}\n"
        "{{- '<start_of_turn>' + role + '\\n' + (lead if loop.first else '') }}\n"
        "{{- message['content'] | trim + '<end_of_turn>\\n' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}\n"),
    "phi3": (
        "{%- for message in messages %}\n"
        "{%- if message['role'] not in ['system', 'user', 'assistant'] %}\n"
        "{{- raise_exception('the ' + message['role'] + ' role is not supported') }}"
        "{%- endif %}\n"
        "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}\n"),
}

OLD_TEMPLATES["shipped"] = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n")

FAMILIES = list(CHAT_TEMPLATES)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """family -> a folder with its random tokenizer; "shipped" -> the shipped model."""
    out = {"shipped": SHIPPED}
    for family in FAMILIES:
        out[family] = write_tokenizer(tmp_path_factory.mktemp(family), family, vocab_size=256)
    return out


def render(tok: Tokenizer, messages: list[dict], template: str | None = None, **kw) -> str:
    """Our rendering, or the error it raised as text (so outcomes compare as strings)."""
    tok = copy.copy(tok)
    tok.chat_template = template or tok.chat_template
    try:
        return tok.apply_chat_template(messages, **kw)
    except ValueError as e:
        return f"error: {e}"


PIECES = ["Hi", " ", "\n", "  padded  ", "naïve café 😀", "{{ x }}", "a'b\"c", "\t", "",
          "<|im_end|>", "</think>", "<tool_call>", "[INST]", "word " * 12]


def random_history(rng: random.Random) -> list[dict]:
    """A seeded history without tools: mostly well formed (a system message or not, then user
    and assistant alternating), sometimes any roles in any order."""
    n = rng.randint(1, 7)
    if rng.random() < 0.75:
        roles = (["system"] if rng.random() < 0.4 else []) + \
            [("user", "assistant")[k % 2] for k in range(n)]
    else:
        roles = [rng.choice(["system", "user", "assistant", "developer"]) for _ in range(n)]
    return [{"role": r, "content": "".join(rng.choices(PIECES, k=rng.randint(0, 4)))}
            for r in roles]


@pytest.mark.parametrize("family", [*FAMILIES, "shipped"])
def test_a_history_without_tools_renders_as_before_tools(folders, family):
    tok = Tokenizer.from_dir(folders[family])
    new = tok.chat_template if family == "shipped" else CHAT_TEMPLATES[family]
    rng, rendered = random.Random(f"bytes-{family}"), 0
    for _ in range(300):
        history = random_history(rng)
        gen = rng.random() < 0.5
        want = render(tok, history, OLD_TEMPLATES[family], add_generation_prompt=gen, **DATE)
        msgs = chat_messages([ChatMessage(**m) for m in history])
        for tools, kwargs in ((None, {}), ([], {}), (None, {"enable_thinking": True})):
            extra = template_vars(tools, {**DATE, **kwargs})
            assert render(tok, msgs, new, add_generation_prompt=gen, **extra) == want, history
        rendered += not want.startswith("error:")
    assert rendered >= 100  # most histories render: the comparison is not between two errors


# ---------------------------------------------------------------------------- with tools

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, now.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now"}},
    {"type": "function", "function": {
        "name": "book", "description": "Books a table: «naïve» text stays as it is.",
        "parameters": {"type": "object", "properties": {"people": {
            "type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "age": {"type": "integer", "default": None}}}}}},
        "strict": True}},
]
WEATHER = {"city": "Paris", "unit": "celsius"}


def call(cid: str, name: str, arguments) -> dict:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


SYSTEM = {"role": "system", "content": "Be brief."}
ASK = {"role": "user", "content": "Weather in Paris?"}
CALLED = {"role": "assistant", "content": None,
          "tool_calls": [call("call00001", "get_weather", WEATHER)]}
RESULT = {"role": "tool", "content": '{"temp": 22}', "tool_call_id": "call00001"}
HISTORIES = {  # wire-shaped, as a client sends them (arguments as JSON text)
    "call_and_result": [ASK, CALLED, RESULT, {"role": "assistant", "content": "22 C."},
                        {"role": "user", "content": "Thanks"}],
    "parallel": [ASK, {"role": "assistant", "content": "Let me check.", "tool_calls": [
        call("call00002", "get_weather", {"city": "Oslo"}), call("call00003", "now", {})]},
        {"role": "tool", "content": "-3 C", "tool_call_id": "call00002"},
        {"role": "tool", "content": "14:00"}],  # no tool_call_id: it renders all the same
    "reasoning": [ASK, {**CALLED, "reasoning_content": "\nI should look it up.\n"}, RESULT,
                  {"role": "assistant", "content": "22 C.", "reasoning": "It said 22."}],
    "old_reasoning": [ASK, {"role": "assistant", "content": "22 C.", "reasoning": "Guess."},
                      {"role": "user", "content": "Sure? {{ not a template }} 😀"}],
    "nested": [ASK, {"role": "assistant", "content": "", "tool_calls": [call(
        "call00004", "book", {"people": [{"name": "Zoë", "age": 3}, {"name": "Al"}]})]}],
    "tools_only": [ASK],
}


def wire(messages: list[dict]) -> list[dict]:
    return chat_messages([ChatMessage(**m) for m in messages])


@pytest.mark.parametrize("family", [*FAMILIES, "shipped"])
def test_with_tools_transformers_renders_what_we_render(folders, family):
    from transformers import PreTrainedTokenizerFast

    ours, theirs = Tokenizer.from_dir(folders[family]), \
        PreTrainedTokenizerFast.from_pretrained(folders[family])
    tools = template_vars([ToolDefinition(**t) for t in TOOLS], None)["tools"]
    assert tools == TOOLS  # OpenAI's shape, no field added
    rendered = 0
    for name, history in HISTORIES.items():
        for system in ([], [SYSTEM]):
            msgs = wire(system + history)
            for gen in (True, False):
                for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
                    got = render(ours, msgs, tools=tools, add_generation_prompt=gen,
                                 **DATE, **kwargs)
                    try:
                        want = theirs.apply_chat_template(
                            msgs, tools=tools, tokenize=False, add_generation_prompt=gen,
                            **DATE, **kwargs)
                    except Exception as e:  # noqa: BLE001 (jinja's TemplateError, as raised)
                        want = f"error: {e}"
                    assert got.startswith("error:") == want.startswith("error:"), (name, got)
                    if not got.startswith("error:"):
                        assert got == want, (name, system, gen, kwargs)
                        rendered += 1
    assert rendered >= 36  # each history renders (mistral refuses the system message)


def text_of(folders, family: str, history: list[dict], tools=TOOLS, **kw) -> str:
    tok = Tokenizer.from_dir(folders[family])
    kw.setdefault("add_generation_prompt", True)
    return tok.apply_chat_template(wire(history), tools=tools, **DATE, **kw)


TOOL_CALL = ('<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Paris", "unit": "celsius"}}\n</tool_call>')
RESPONSE = '<tool_response>\n{"temp": 22}\n</tool_response>'


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "shipped"])
def test_hermes_format(folders, family):
    text = text_of(folders, family, [SYSTEM, *HISTORIES["call_and_result"]])
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in TOOLS)
    assert text.startswith(("<|begin_of_text|>" if family == "shipped" else "")
                           + "<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert f"<tools>\n{lines}\n</tools>" in text and text.count("<|im_start|>system") == 1
    assert f"<|im_start|>assistant\n{TOOL_CALL}<|im_end|>\n" in text
    assert f"<|im_start|>user\n{RESPONSE}<|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n")
    two = text_of(folders, family, HISTORIES["parallel"])
    assert ('<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n{"name": "now", '
            '"arguments": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n'
            '-3 C\n</tool_response>\n<tool_response>\n14:00\n</tool_response><|im_end|>\n') in two


def test_qwen3_thinks_after_the_last_question_only(folders):
    text = text_of(folders, "qwen3", HISTORIES["reasoning"], enable_thinking=False)
    assert f"<|im_start|>assistant\n<think>\nI should look it up.\n</think>\n\n{TOOL_CALL}" in text
    assert "<|im_start|>assistant\n<think>\nIt said 22.\n</think>\n\n22 C.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    thinking = text_of(folders, "qwen3", HISTORIES["reasoning"], enable_thinking=True)
    assert thinking == text[:-len("<think>\n\n</think>\n\n")]
    old = text_of(folders, "qwen3", HISTORIES["old_reasoning"])
    assert "<think>" not in old and "Guess." not in old  # before the last question: dropped


def test_llama_json_tools(folders):
    text = text_of(folders, "llama", [SYSTEM, *HISTORIES["call_and_result"]])
    assert text.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n")
    assert "".join(json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in TOOLS) \
        + "Weather in Paris?<|eot_id|>" in text
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", '
            '"parameters": {"city": "Paris", "unit": "celsius"}}<|eot_id|>') in text
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 22}<|eot_id|>' in text
    two = text_of(folders, "llama", HISTORIES["parallel"])
    assert ('{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
            '{"name": "now", "parameters": {}}<|eot_id|>') in two
    with pytest.raises(ValueError, match="first user message"):
        text_of(folders, "llama", [{"role": "assistant", "content": "x"}])


def test_mistral_markers(folders):
    text = text_of(folders, "mistral", HISTORIES["call_and_result"])
    assert text == (
        '<s>[INST] Weather in Paris? [/INST][TOOL_CALLS] [{"name": "get_weather", "arguments": '
        '{"city": "Paris", "unit": "celsius"}, "id": "call00001"}]</s>[TOOL_RESULTS] '
        '{"content": "{\\"temp\\": 22}", "call_id": "call00001"}[/TOOL_RESULTS]22 C.</s>'
        f"[AVAILABLE_TOOLS] {json.dumps(TOOLS, ensure_ascii=False)}[/AVAILABLE_TOOLS]"
        "[INST] Thanks [/INST]")
    with pytest.raises(ValueError, match="alternate"):  # tool traffic aside, roles alternate
        text_of(folders, "mistral", [ASK, CALLED, RESULT, ASK])


@pytest.mark.parametrize("family, head, turn", [
    ("gemma3", "<bos><start_of_turn>user\nBe brief.\n\n# Tools\n\n", ("<start_of_turn>model\n",
                                                                      "<start_of_turn>user\n",
                                                                      "<end_of_turn>\n")),
    ("phi3", "<|system|>\nBe brief.\n\n# Tools\n\n", ("<|assistant|>\n", "<|user|>\n",
                                                      "<|end|>\n"))])
def test_a_json_tool_list_where_no_format_is_published(folders, family, head, turn):
    text = text_of(folders, family, [SYSTEM, *HISTORIES["call_and_result"]])
    model, user, end = turn
    assert text.startswith(head) and json.dumps(TOOLS, ensure_ascii=False) in text
    assert f"{model}{TOOL_CALL}{end}{user}{RESPONSE}{end}{model}22 C.{end}" in text


def test_the_shipped_template_is_train_tinys_and_qwen2s_behind_a_bos():
    source = (ROOT / "tools" / "train_tiny.py").read_text()
    written = next(ast.literal_eval(n.value) for n in ast.parse(source).body
                   if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") ==
                   "CHAT_TEMPLATE")
    shipped = json.loads((SHIPPED / "tokenizer_config.json").read_text())["chat_template"]
    assert shipped == written == "{{- bos_token }}\n" + CHAT_TEMPLATES["qwen2"]


# ---------------------------------------------------------------------------- the renderer

def refusal(messages=None, tools=None, kwargs=None) -> ApiError:
    with pytest.raises(ApiError) as e:
        if messages is not None:
            wire(messages)
        else:
            template_vars(tools, kwargs)
    assert e.value.status == 400
    return e.value


def test_the_renderer_gives_templates_the_agreed_shape():
    msgs = wire([ASK, {**CALLED, "reasoning": "r"}, RESULT,
                 {"role": "assistant", "content": "ok", "tool_calls": []},
                 {"role": "assistant", "content": None,
                  "tool_calls": [call("c", "now", {}) | {"function": {"name": "now",
                                                                      "arguments": " "}}]}])
    assert msgs[1] == {"role": "assistant", "content": "", "reasoning_content": "r",
                       "reasoning": "r", "tool_calls": [{"id": "call00001", "type": "function",
                                                         "function": {"name": "get_weather",
                                                                      "arguments": WEATHER}}]}
    assert msgs[2] == {"role": "tool", "content": '{"temp": 22}', "tool_call_id": "call00001"}
    assert msgs[3] == {"role": "assistant", "content": "ok"}  # an empty list is no calls
    assert msgs[4]["tool_calls"][0]["function"]["arguments"] == {}  # blank text: no arguments
    assert wire([ASK]) == [{"role": "user", "content": "Weather in Paris?"}]


@pytest.mark.parametrize("arguments, says", [
    ("{not json", "is not valid JSON"), ("[1, 2]", "must be a JSON object, not list"),
    ('"text"', "not str"), ("42", "not int"), ('{"a": 1} x', "is not valid JSON")])
def test_arguments_that_are_not_a_json_object_are_a_400(arguments, says):
    bad = {**CALLED, "tool_calls": [{**CALLED["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": arguments}}]}
    err = refusal([ASK, bad])
    assert err.param == "messages" and "messages[1].tool_calls[0].function.arguments" in \
        err.message and says in err.message


@pytest.mark.parametrize("message", [
    {"role": "user", "content": "x", "tool_calls": [call("c", "now", {})]},
    {"role": "user", "content": "x", "tool_call_id": "c"},
    {"role": "user", "content": "x", "reasoning": "r"},
    {"role": "tool", "content": None, "tool_call_id": "c"}])
def test_fields_a_role_cannot_carry_are_a_400(message):
    assert refusal([message]).param == "messages"


@pytest.mark.parametrize("key", ["messages", "tools", "add_generation_prompt", "bos_token",
                                 "chat_template", "raise_exception"])
def test_a_template_kwarg_the_server_sets_is_a_400(key):
    err = refusal(kwargs={"enable_thinking": False, key: 1})
    assert err.param == "chat_template_kwargs" and repr(key) in err.message
    assert template_vars(None, {"enable_thinking": False}) == {"tools": None,
                                                               "enable_thinking": False}


# ---------------------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def server():
    from nanoserve.async_engine import AsyncLLM
    from nanoserve.entrypoints.openai.app import build_app

    engine = AsyncLLM.from_options(dtype="float32")  # the shipped model, Qwen 3's template
    with ServerThread(build_app(engine, "nanoserve-tiny",
                                chat_template=CHAT_TEMPLATES["qwen3"])) as s:
        s.tokenizer = copy.copy(engine.tokenizer)
        s.tokenizer.chat_template = CHAT_TEMPLATES["qwen3"]
        yield s
    snap = engine.snapshot()
    assert snap.num_free_blocks == snap.num_blocks


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def test_tokenize_renders_tools_and_template_kwargs(server):
    history = HISTORIES["reasoning"]
    seen = set()
    for kwargs in ({"enable_thinking": False}, {"enable_thinking": True}, None):
        r = post(server, "/tokenize", {"messages": history, "tools": TOOLS,
                                       "chat_template_kwargs": kwargs})
        assert r.status_code == 200, r.text
        want = server.tokenizer.apply_chat_template(wire(history), tools=TOOLS, tokenize=True,
                                                    **(kwargs or {}))
        assert r.json()["tokens"] == want
        seen.add(tuple(want))
    assert len(seen) == 2  # enable_thinking=False reached the template; True is the default
    bare = post(server, "/tokenize", {"messages": history}).json()["tokens"]
    assert len(bare) < len(want)  # without tools, no tools block


def test_chat_completions_counts_what_tokenize_counts_for_a_tool_history(server):
    history = HISTORIES["call_and_result"]
    count = post(server, "/tokenize", {"messages": history}).json()["count"]
    r = post(server, "/v1/chat/completions", {"messages": history, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == count


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_bad_history_and_kwargs_are_400s_naming_the_field(server, path):
    bad = {**CALLED, "tool_calls": [{**CALLED["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": "{'city': 'Paris'}"}}]}
    err = error_of(post(server, path, {"messages": [ASK, bad], "max_tokens": 1}), 400)
    assert err["param"] == "messages" and "arguments" in err["message"]
    err = error_of(post(server, path, {"messages": [ASK], "max_tokens": 1,
                                       "chat_template_kwargs": {"add_generation_prompt": False}}),
                   400)
    assert err["param"] == "chat_template_kwargs"

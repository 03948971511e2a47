"""Day 79's numbers: a forced tool call as a grammar, on the shipped model.

Everything runs nanoserve-tiny in float32 through ``LLM``, greedy. The chapter's eight tools
(``TOOLS``) are rendered into the prompts by the checkpoint's chat template, each question
(``QUESTIONS``) with the half of the tools that holds its own (``half``), and each is asked
once per arm:

- *named*: question ``i`` with ``tool_choice`` naming tool ``i``, under the package's
  ``forced_call_spec``;
- *required*: every question with ``tool_choice: "required"``, ``parallel_tool_calls`` off
  (and, in one row, on);
- *no grammar*: the same prompts with nothing forced, read back by the same parsers.

Each call's arguments are validated by ``jsonschema``, which nanoserve did not write. The mask
rows read llguidance's matcher on the shipped tokenizer directly; the snapshot's schemas and
reader are held against the package's spec and parsers.
"""

from __future__ import annotations

import functools
import json

from chapters.common import SHIPPED
from chapters.runner import exact

from .snapshot import forced as frozen


def _obj(props: dict, required: list[str] | None = None, **extra) -> dict:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required, **extra}


TOOLS = [
    {"name": "get_weather", "description": "Weather in a city.",
     "parameters": _obj({"city": {"type": "string", "maxLength": 20},
                         "unit": {"enum": ["C", "F"]}})},
    {"name": "add", "description": "Add two integers.",
     "parameters": _obj({"a": {"type": "integer", "minimum": 0, "maximum": 999},
                         "b": {"type": "integer", "minimum": 0, "maximum": 999}})},
    {"name": "search", "description": "Search the docs.",
     "parameters": _obj({"query": {"type": "string", "minLength": 1, "maxLength": 20}})},
    {"name": "send_email", "description": "Send an email.",
     "parameters": _obj({"to": {"type": "string",
                                "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
                         "urgent": {"type": "boolean"}})},
    {"name": "set_alarm", "description": "Set an alarm.",
     "parameters": _obj({"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                         "days": {"type": "array", "maxItems": 5,
                                  "items": {"enum": ["mon", "tue", "wed", "thu", "fri"]}}},
                        ["hour"])},
    {"name": "convert", "description": "Convert money.",
     "parameters": _obj({"amount": {"type": "number", "minimum": 0, "maximum": 1000,
                                    "multipleOf": 0.25},
                         "to": {"enum": ["EUR", "USD", "GBP"]}})},
    {"name": "book_room", "description": "Book a room.",
     "parameters": _obj({"title": {"type": "string", "maxLength": 20},
                         "room": _obj({"name": {"type": "string", "maxLength": 8},
                                       "floor": {"type": "integer", "minimum": 0,
                                                 "maximum": 9}})})},
    {"name": "get_time", "description": "The time now."},
]
# book_room with its room kept under $defs, as generated schemas often write it
BOOK_REF = {"name": "book_room", "parameters": _obj(
    {"title": {"type": "string", "maxLength": 20}, "room": {"$ref": "#/$defs/room"}},
    **{"$defs": {"room": TOOLS[6]["parameters"]["properties"]["room"]}})}
REF_TOOLS = TOOLS[:6] + [BOOK_REF] + TOOLS[7:]  # the eight, book_room written that way
# a second tool whose $defs give "room" another meaning (a floor only up to 5)
MOVE_REF = {"name": "move_room", "parameters": _obj(
    {"room": {"$ref": "#/$defs/room"}},
    **{"$defs": {"room": _obj({"name": {"type": "string", "maxLength": 8},
                               "floor": {"type": "integer", "minimum": 0, "maximum": 5}})}})}
BOOKED = '{"title":"standup","room":{"name":"4","floor":%d}}'  # a book_room call's arguments
FLOOR_OK, FLOOR_BAD = 2, 12  # a floor book_room's schema allows (0 to 9), and one it does not
QUESTIONS = ["What is the weather in Paris?", "What is 2 plus 3?", "Find the docs on classes.",
             "Email bob that the build broke.", "Wake me at seven.",
             "How many euros is 10 dollars?", "Book room 4 on floor 2 for standup.",
             "What time is it?"]
MAX_TOKENS = 128  # a forced call's budget
PEEK = 64  # the budget of the arms that never end on their own: no grammar, parallel calls
VOCAB = 2048  # nanoserve-tiny's vocab_size, the width of the logits and the mask
THINK = ("<think>", "</think>", False)  # qwen3's markers: a thought the model opens itself


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


@functools.cache
def llm():
    from nanoserve import LLM

    return LLM(SHIPPED, dtype="float32", max_num_seqs=40, enable_prefix_caching=True)


@functools.cache
def tokenizer():
    """The shipped tokenizer alone: the mask rows need no model."""
    from nanoserve.tokenizer import Tokenizer

    return Tokenizer.from_dir(SHIPPED)


def half(i: int) -> list[dict]:
    """The tools question ``i`` is asked with: the half of ``TOOLS`` that holds its own tool
    (all eight, rendered, would not fit the shipped model's context with room to answer)."""
    return TOOLS[:4] if i < 4 else TOOLS[4:]


def render(messages: list[dict], tools: list[dict] | None, tokenize: bool = True):
    """``messages`` (OpenAI's wire shape) and ``tools`` through the server's own rendering
    (``chat_render``: tool-call arguments parsed, tools passed to the template)."""
    from nanoserve.entrypoints.openai.chat_render import chat_messages, template_vars
    from nanoserve.entrypoints.openai.protocol import ChatMessage, ToolDefinition

    defs = None if tools is None else [ToolDefinition(function=t) for t in tools]
    return llm().tokenizer.apply_chat_template(
        chat_messages([ChatMessage(**m) for m in messages]), add_generation_prompt=True,
        tokenize=tokenize, **template_vars(defs, None))


def prompt(question: str, tools: list[dict]) -> list[int]:
    """The question after ``tools``, as the server renders them."""
    return render([{"role": "user", "content": question}], tools)


def spec(choice, parallel: bool = True, think=None, tools: list[dict] = TOOLS):
    from nanoserve.structured.tools import forced_call_spec

    return forced_call_spec(tools, choice, parallel, think)


def parser(choice, tools: list[dict] = TOOLS):
    from nanoserve.entrypoints.openai.tool_parsers.forced import (
        NamedCallParser,
        RequiredCallsParser,
    )

    name = frozen.chosen(choice)
    return RequiredCallsParser(tools) if name is None else NamedCallParser(tools, name)


# ------------------------------------------------------------------ the spec and the snapshot


def specs_agree() -> str:
    """The snapshot's closed schema against the package's spec, for every forced choice, over
    ``TOOLS`` and over ``REF_TOOLS`` (book_room's room under ``$defs``)."""
    cases = [(ts, c, p) for ts in (TOOLS, REF_TOOLS)
             for c, p in [("required", True), ("required", False)]
             + [(named(t["name"]), True) for t in ts]]
    same = sum(frozen.forced_call_schema(ts, c, p) == spec(c, p, tools=ts).schema()
               for ts, c, p in cases)
    return f"{same} of {len(cases)} equal"


# ------------------------------------------------------------------ masks


@functools.cache
def backend():
    from nanoserve.structured.backend import GrammarBackend

    return GrammarBackend.for_tokenizer(tokenizer(), VOCAB, tokenizer().eos_token_ids)


def allowed_after(grammar_spec, text: str) -> list[str]:
    """The tokens (as text) the spec's mask allows after ``text``."""
    from nanoserve.structured.mask import allowed, fill

    m, tok = backend().matcher(grammar_spec), tokenizer()
    assert m.consume_tokens(tok.encode(text, add_special_tokens=False)), text
    ok = allowed(fill([m], VOCAB), VOCAB)[0]
    return [tok.decode([i], skip_special_tokens=False) for i in ok.nonzero().flatten().tolist()]


def _listed(tokens: list[str]) -> str:
    if len(tokens) > 3:
        return f"{len(tokens):,} tokens"
    return " and ".join(repr(t) for t in tokens) + " only" * (len(tokens) == 1)


def first_step() -> str:
    req, one = allowed_after(spec("required"), ""), allowed_after(spec(named("add")), "")
    think = allowed_after(spec("required", think=THINK), "")
    return f"required: {_listed(req)}; named: {_listed(one)}; required, thinking allowed: " \
           f"{_listed(think)}"


WEATHER_SO_FAR = '{"city":"Paris","unit":"C"'


def strict_closing() -> str:
    from nanoserve.structured.params import StructuredOutputsParams

    schema = TOOLS[0]["parameters"]
    opened = allowed_after(StructuredOutputsParams(json=schema), WEATHER_SO_FAR)
    shut = allowed_after(StructuredOutputsParams(json=schema, strict=True), WEATHER_SO_FAR)
    return f"open: {_listed(opened)}; strict: {_listed(shut)}"


ONE_CALL = '[{"name":"get_time","parameters":{}}'


def one_call() -> str:
    on = allowed_after(spec("required", True), ONE_CALL)
    off = allowed_after(spec("required", False), ONE_CALL)
    return f"parallel calls on: {_listed(on)}; off: {_listed(off)}"


def _whole(grammar_spec, text: str) -> bool:
    """Whether the spec's matcher takes all of ``text`` and may stop there."""
    m, tok = backend().matcher(grammar_spec), tokenizer()
    return m.consume_tokens(tok.encode(text, add_special_tokens=False)) and m.is_accepting()


def defs_lifted() -> str:
    """``BOOK_REF`` compiled as a named call and inside the required array (with the last
    three of ``REF_TOOLS`` beside it); the required grammar fed a call within book_room's
    range and one outside it; and ``BOOK_REF`` beside ``MOVE_REF``, which gives ``room``
    another meaning, under the package and the snapshot."""
    from nanoserve.structured.tools import forced_call_spec

    out = []
    for label, choice in (("named", named("book_room")), ("required", "required")):
        backend().template(forced_call_spec(REF_TOOLS[4:], choice, True))
        out.append(f"{label}: compiles")
    req = forced_call_spec(REF_TOOLS[4:], "required", False)
    calls = {f: f'[{{"name":"book_room","parameters":{BOOKED % f}}}]'
             for f in (FLOOR_OK, FLOOR_BAD)}
    verdict = {f: "accepted" if _whole(req, text) else "refused" for f, text in calls.items()}
    out.append(f"a required call with floor {FLOOR_OK}: {verdict[FLOOR_OK]}, floor "
               f"{FLOOR_BAD}: {verdict[FLOOR_BAD]}")
    refused = []
    for make in (lambda ts: forced_call_spec(ts, "required", True),
                 lambda ts: frozen.forced_call_schema(ts, "required")):
        try:
            make([BOOK_REF, MOVE_REF])
            refused.append("built")
        except ValueError as e:
            refused.append(f"refused, {str(e).split('; ')[0]}")
    out.append(f"beside a tool defining room differently: {' / '.join(sorted(set(refused)))}")
    return "; ".join(out)


def thinking() -> str:
    """What the thinking grammar (the package's, and the snapshot's) accepts whole."""
    from nanoserve.structured.params import StructuredOutputsParams

    call = '[{"name":"get_time","parameters":{}}]'
    texts = {"a thought, then the call": f"<think>plan</think>\n{call}",
             "the call alone": call,
             "the call, then a thought": f"{call}<think>late</think>"}
    closed = frozen.forced_call_schema(TOOLS, "required")
    grammars = [spec("required", think=THINK),
                StructuredOutputsParams(grammar=frozen.think_then_call(closed, *THINK))]
    tok, out = tokenizer(), []
    for label, text in texts.items():
        verdicts = set()
        for g in grammars:
            m = backend().matcher(g)
            ok = m.consume_tokens(tok.encode(text, add_special_tokens=False))
            verdicts.add("accepted" if ok and m.is_accepting() else "refused")
        out.append(f"{label}: {' / '.join(sorted(verdicts))}")
    return "; ".join(out)


# ------------------------------------------------------------------ the model


def _validates(choice, tools: list[dict], text: str) -> bool:
    """Whether ``text``, read by the package's parser, is one or more calls whose arguments
    validate against their function's schema."""
    import jsonschema

    calls = parser(choice, tools).extract(text).calls
    by_name = {t["name"]: frozen.parameters(t) for t in TOOLS}
    try:
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), by_name[c.name])
    except (ValueError, KeyError, jsonschema.ValidationError):
        return False
    return bool(calls)


@functools.cache
def runs() -> dict:
    """Every arm's ``(choice, tools, output)`` rows, from one ``generate`` of them all."""
    from nanoserve import SamplingParams
    from nanoserve.structured.params import StructuredOutputsParams

    tools = [half(i) for i in range(len(QUESTIONS))]
    ids = [prompt(q, ts) for q, ts in zip(QUESTIONS, tools, strict=True)]
    nam, req = [named(t["name"]) for t in TOOLS], ["required"] * len(TOOLS)

    def forced(choices, parallel: bool) -> list[SamplingParams]:
        return [SamplingParams(max_tokens=PEEK if parallel else MAX_TOKENS, temperature=0,
                               structured_outputs=spec(c, parallel, tools=ts))
                for c, ts in zip(choices, tools, strict=True)]
    arms = {  # arm -> (the choice each prompt is read as, its sampling params)
        "named": (nam, forced(nam, False)),
        "required": (req, forced(req, False)),
        "free": (nam, [SamplingParams(max_tokens=PEEK, temperature=0)] * len(ids)),
        "parallel": (req, forced(req, True)),
        "think": (req, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                       structured_outputs=spec("required", False, THINK, ts))
                        for ts in tools]),
        "loose": (nam, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                       structured_outputs=StructuredOutputsParams(
                                           json=frozen.parameters(t))) for t in TOOLS]),
    }
    # the tools are a long prefix each half shares: prefill one prompt of each half first, so
    # that the batch finds their blocks in the prefix cache
    llm().generate([ids[0], ids[-1]], SamplingParams(max_tokens=1))
    outs = iter(llm().generate(ids * len(arms), [p for _, ps in arms.values() for p in ps]))
    out = {arm: [(c, ts, next(outs)) for c, ts in zip(cs, tools, strict=True)]
           for arm, (cs, _) in arms.items()}
    # the free outputs, read as required calls too: 16 readings of 8 texts
    out["free"] += [(c, ts, o) for c, (_, ts, o) in zip(req, out["free"], strict=True)]
    return out


def prompt_tokens() -> str:
    q = QUESTIONS[0]
    return f"{len(prompt(q, half(0))):,} with the first four tools; " \
           f"{len(render([{'role': 'user', 'content': q}], None)):,} without"


HISTORY = [{"role": "user", "content": QUESTIONS[1]},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "5"}]


def round_trip() -> str:
    """The history's call and result as the template writes them (between their tags)."""
    text = render(HISTORY, half(1), tokenize=False)
    call = text.split("<tool_call>\n")[-1].split("\n</tool_call>")[0]  # the last: the call
    result = text.split("<tool_response>\n")[1].split("\n</tool_response>")[0]
    return f"call: {call}; result: {result}"


def valid(arm: str) -> str:
    rows = runs()[arm]
    return f"{sum(_validates(c, ts, o.text) for c, ts, o in rows)} of {len(rows)}"


def right_function() -> str:
    rows = runs()["required"]
    hits = sum(frozen.read_forced(o.text, c)[0][0] == t["name"]
               for (c, _, o), t in zip(rows, TOOLS, strict=True))
    return f"{hits} of {len(rows)}"


def parallel_ends() -> str:
    rows = runs()["parallel"]
    ended = sum(o.finish_reason == "stop" for _, _, o in rows)
    begun = sum(o.text.count('{"name":"') for _, _, o in rows)
    return f"{ended} of {len(rows)} end within {PEEK} tokens; calls begun: {begun}"


def thinking_runs() -> str:
    """Required calls under the thinking grammar: how many reached a call, and how many are
    still inside a thought the model opened when the budget ran out."""
    rows = runs()["think"]
    called = sum(_validates(c, ts, o.text.split("</think>")[-1]) for c, ts, o in rows)
    open_ = sum(o.finish_reason == "length" and "</think>" not in o.text for _, _, o in rows)
    return f"{called} valid calls; {open_} still inside a thought at {MAX_TOKENS} tokens"


def extra_keys() -> str:
    """Named calls, under the function's schema compiled open and strict, that hold a key
    the function does not declare."""
    def extra(text: str, name: str) -> bool:
        try:
            keys = set(json.loads(text))
        except ValueError:
            return False
        params = frozen.parameters(next(t for t in TOOLS if t["name"] == name))
        return bool(keys - set(params["properties"]))
    loose = sum(extra(o.text, frozen.chosen(c)) for c, _, o in runs()["loose"])
    strict = sum(extra(o.text, frozen.chosen(c)) for c, _, o in runs()["named"])
    return f"open: {loose} of {len(TOOLS)}; strict: {strict} of {len(TOOLS)}"


# ------------------------------------------------------------------ reading the output back


def read_back() -> str:
    """The package's parsers against the snapshot's reader on every forced output, whole and
    fed one token's text at a time."""
    whole = streamed = 0
    tok = llm().tokenizer
    rows = runs()["named"] + runs()["required"]
    for c, ts, o in rows:
        want = frozen.read_forced(o.text, c)
        got = parser(c, ts).extract(o.text)
        whole += [(x.name, x.arguments) for x in got.calls] == want and got.content is None
        p, pieces = parser(c, ts), []
        for i in range(len(o.token_ids)):
            pieces.append(p.feed(tok.decode(o.token_ids[:i + 1])[len(tok.decode(
                o.token_ids[:i])):]))
        pieces.append(p.finish())
        calls: dict[int, list[str]] = {}
        for d in pieces:
            for cd in d.calls:
                if cd.name is not None:
                    calls[cd.index] = [cd.name, ""]
                calls[cd.index][1] += cd.arguments
        streamed += [tuple(v) for _, v in sorted(calls.items())] == want and \
            not "".join(d.content for d in pieces)
    return f"whole: {whole} of {len(rows)}; streamed: {streamed} of {len(rows)}"


CLAIMS = [
    exact("the snapshot's closed schemas against the package's forced_call_spec, over the 8 "
          "tools and over them with book_room's room under $defs: required (parallel calls "
          "on, off) and each function named", specs_agree),
    exact("tokens the mask allows at a forced call's first step", first_step),
    exact("after '{\"city\":\"Paris\",\"unit\":\"C\"' under get_weather's schema, the mask "
          "allows", strict_closing),
    exact("after one whole call '[{\"name\":\"get_time\",\"parameters\":{}}', the required "
          "grammar allows", one_call),
    exact("book_room with its room under $defs and a $ref to it: its grammars, a required call "
          "within its range and outside it, and beside a second tool that defines room "
          "differently", defs_lifted),
    exact("the thinking grammar (qwen3's markers), package and snapshot", thinking),
    exact("prompt tokens for the first question, rendered with its tools and without",
          prompt_tokens),
    exact("a history sent back: the assistant's call (arguments '{\"a\":2,\"b\":3}') and the "
          "tool's result '5', as the template renders them", round_trip),
    exact("named calls, one per function, greedy: arguments that validate", lambda: valid("named")),
    exact("required calls, parallel_tool_calls false, one per question: calls that validate",
          lambda: valid("required")),
    exact("the same 8 prompts with no grammar, read as named and as required: valid calls",
          lambda: valid("free")),
    exact("required calls that name the function the question asks for", right_function),
    exact("required with parallel calls on, 8 questions", parallel_ends),
    exact("required calls under the thinking grammar, 8 questions", thinking_runs),
    exact("named calls that add a key the function does not declare, schema compiled open or "
          "strict", extra_keys),
    exact("16 forced outputs read back by the package's parsers, against the snapshot's reading",
          read_back),
]

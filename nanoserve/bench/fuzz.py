"""The bad-input fuzzer: hundreds of distinct malformed requests against a live server.

Why this module exists: a server is judged by its worst input. Every request here is wrong in one
way that a real client, a broken proxy or a hostile one can produce, and each must get a 4xx in
OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``: never a 5xx, never a
traceback, never a hang. Afterwards ``/health`` must still be 200 and a valid request must still
succeed. The cases are seeded, so a failing one can be replayed by its index.

The categories, one generator each (``CATEGORIES``): broken and truncated JSON, wrong content
types, wrong types for every field, missing required fields, nulls where a value is required,
huge and negative integers, NaN and infinity, out-of-range sampling values, empty and enormous
prompts, token ids outside the vocabulary, nested junk, invalid UTF-8, raw control characters,
oversized bodies, bad chat messages, and OpenAI fields this engine does not support.

    cases = bad_requests(seed=0, vocab_size=2048, max_model_len=512)
    report = run_fuzz("http://127.0.0.1:8000", cases)   # {"categories": {...}, "5xx": 0, ...}
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
JSON = {"content-type": "application/json"}

# Every field a request may carry, with a value of the right type: the wrong-type cases swap one.
FIELDS = {"prompt": "The for statement", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9,
          "top_k": 5, "seed": 1, "stop": ["\n"], "n": 1, "logprobs": 2, "stream": False,
          "presence_penalty": 0.1, "frequency_penalty": 0.1, "ignore_eos": True,
          "stop_token_ids": [1], "min_tokens": 1, "min_p": 0.1, "repetition_penalty": 1.1,
          "model": "nanoserve-tiny"}
WRONG = [[1, "x"], {"a": 1}, "seven", True, 1.5, [[[]]], {"nested": {"deeper": [1]}}]
SAMPLING_OUT_OF_RANGE = {
    "temperature": [-1, -0.001, -1e9], "top_p": [0, -0.5, 1.0001, 7], "top_k": [-2, -100],
    "min_p": [-0.1, 1.5], "presence_penalty": [-2.5, 3], "frequency_penalty": [-9, 2.01],
    "repetition_penalty": [0, -1], "logprobs": [-1, 21, 1000], "n": [0, -1, 9, 1000],
    "max_tokens": [0, -1], "min_tokens": [-1], "seed": [2**64, -(2**64)],
}
UNSUPPORTED = {"tools": [{"type": "function", "function": {"name": "f"}}],
               "tool_choice": "auto", "guided_regex": "a+",
               "functions": [{"name": "f"}], "logit_bias": {"99999999": 10}, "suffix": "end",
               "prompt_logprobs": -1, "best_of": 3, "parallel_tool_calls": "yes",
               "guided_json": {"type": "object"}, "prediction": {"type": "content"}}


@dataclass(frozen=True, slots=True)
class Case:
    category: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    @classmethod
    def json(cls, category: str, path: str, obj, **dump) -> Case:
        return cls(category, path, tuple(JSON.items()), json.dumps(obj, **dump).encode())


def _base(path: str) -> dict:
    if path == CHAT:
        return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return {"prompt": "The for statement", "max_tokens": 4}


def _broken_json(rng: random.Random, _v, _m):
    text = json.dumps(_base(COMPLETIONS) | {"temperature": 0.3})
    for cut in range(1, len(text) - 1, 3):
        yield Case("broken_json", COMPLETIONS, tuple(JSON.items()), text[:cut].encode())
    for junk in ("{", "}", "[1,2", '{"prompt": "a",}', "nul", '{"prompt" "a"}', "'a'", "{}}",
                 '{"prompt": tru}', "\x00", ""):
        yield Case("broken_json", CHAT, tuple(JSON.items()), junk.encode())


def _content_types(rng, _v, _m):
    body = json.dumps(_base(COMPLETIONS)).encode()
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
               "application/xml", "image/png", "application/jsonx", "text/json; charset=utf-7"):
        for path in (COMPLETIONS, CHAT):
            yield Case("content_type", path, (("content-type", ct),), body)
    yield Case("content_type", COMPLETIONS, (), b"prompt=hello&max_tokens=3")


def _wrong_types(rng, _v, _m):
    for name, good in FIELDS.items():
        for bad in WRONG:
            if type(bad) is type(good) or (isinstance(good, float) and type(bad) is int):
                continue
            if name in ("prompt", "stop") and (isinstance(bad, str) or isinstance(bad, list) and
                                               all(isinstance(x, str) for x in bad)):
                continue  # a string, or a list of strings, is a legal prompt and stop
            for path in (COMPLETIONS, CHAT):
                body = _base(path) | {name: bad}
                if path == CHAT and (name == "prompt" or name == "logprobs" and bad is True):
                    continue  # chat has no prompt, and its logprobs is a bool
                yield Case.json("wrong_types", path, body)
    for bad in WRONG + [5, None]:
        yield Case.json("wrong_types", CHAT, {"messages": bad, "max_tokens": 2})


def _missing(rng, _v, _m):
    for path, required in ((COMPLETIONS, "prompt"), (CHAT, "messages")):
        for extra in ({}, {"max_tokens": 3}, {"temperature": 0}, {"stream": True}, {"n": 2}):
            body = {k: v for k, v in (_base(path) | extra).items() if k != required}
            yield Case.json("missing_required", path, body)
    yield Case.json("missing_required", COMPLETIONS, {})
    yield Case.json("missing_required", CHAT, {})
    yield Case.json("missing_required", CHAT, {"messages": [{"content": "no role"}]})


def _nulls(rng, _v, _m):
    yield Case.json("nulls", COMPLETIONS, {"prompt": None})
    yield Case.json("nulls", CHAT, {"messages": None})
    for inner in ([None], ["a", None], [[1, None]], [None, None]):
        yield Case.json("nulls", COMPLETIONS, {"prompt": inner, "max_tokens": 2})
    for msg in (None, {"role": None, "content": "x"}, {"role": "user", "content": [None]}):
        yield Case.json("nulls", CHAT, {"messages": [msg], "max_tokens": 2})
    yield Case.json("nulls", COMPLETIONS, {"prompt": "a", "stop": [None]})
    yield Case.json("nulls", COMPLETIONS, {"prompt": "a", "stop_token_ids": [None]})


def _integers(rng, _v, _m):
    for name in ("max_tokens", "n", "top_k", "logprobs", "min_tokens", "seed",
                 "max_completion_tokens"):
        for value in (-1, -(2**31), 2**31, 2**63, 10**30, -(10**30)):
            path = CHAT if name == "max_completion_tokens" else COMPLETIONS
            if name == "seed" and -(2**63) <= value < 2**64:
                continue  # a seed may be any 64-bit integer
            if name == "top_k" and value == -1:
                continue  # top_k -1 is legal: "off"
            yield Case.json("huge_negative_integers", path, _base(path) | {name: value})


def _nan_inf(rng, _v, _m):
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "max_tokens", "top_k"):
        for literal in ("NaN", "Infinity", "-Infinity"):
            body = json.dumps(_base(COMPLETIONS))[:-1] + f', "{name}": {literal}}}'
            yield Case("nan_inf", COMPLETIONS, tuple(JSON.items()), body.encode())


def _out_of_range(rng, _v, _m):
    for name, values in SAMPLING_OUT_OF_RANGE.items():
        for value in values:
            for path in (COMPLETIONS, CHAT):
                yield Case.json("out_of_range_sampling", path, _base(path) | {name: value})
    yield Case.json("out_of_range_sampling", COMPLETIONS,
                    _base(COMPLETIONS) | {"min_tokens": 9, "max_tokens": 3})


def _prompts(rng, vocab, max_len):
    for prompt in ("", [], [[]], [""], ["a", ""], ["a", []]):
        yield Case.json("empty_enormous_prompts", COMPLETIONS, {"prompt": prompt})
    yield Case.json("empty_enormous_prompts", COMPLETIONS, {"prompt": [1] * max_len})
    yield Case.json("empty_enormous_prompts", COMPLETIONS,
                    {"prompt": [1] * (max_len - 2), "max_tokens": 10})
    yield Case.json("empty_enormous_prompts", COMPLETIONS, {"prompt": "word " * (4 * max_len)})
    yield Case.json("empty_enormous_prompts", CHAT,
                    {"messages": [{"role": "user", "content": "word " * (4 * max_len)}]})
    yield Case.json("empty_enormous_prompts", COMPLETIONS, {"prompt": ["a"] * 5000})


def _vocab(rng, vocab, _m):
    for bad in (vocab, vocab + 1, -1, -vocab, 2**40, 2**63 - 1):
        yield Case.json("token_ids_outside_vocab", COMPLETIONS, {"prompt": [1, 2, bad]})
        yield Case.json("token_ids_outside_vocab", COMPLETIONS, {"prompt": [[1], [bad]]})
        yield Case.json("token_ids_outside_vocab", COMPLETIONS,
                        _base(COMPLETIONS) | {"stop_token_ids": [bad]})


def _nested(rng, _v, _m):
    deep = current = {}
    for _ in range(50):
        current["x"] = {}
        current = current["x"]
    for junk in (deep, [[["a"]]], [[1, [2]]], {"a": [1]}, [{"text": "a"}], [1.5, 2.5],
                 [True, False], [[1, "a"]]):
        yield Case.json("nested_junk", COMPLETIONS, {"prompt": junk, "max_tokens": 2})
    yield Case.json("nested_junk", CHAT, {"messages": [[{"role": "user"}]]})
    yield Case.json("nested_junk", CHAT, {"messages": {"role": "user", "content": "x"}})
    nest = "[" * 5000 + "]" * 5000
    yield Case("nested_junk", COMPLETIONS, tuple(JSON.items()),
               f'{{"prompt": {nest}}}'.encode())


def _utf8(rng, _v, _m):
    for bad in (b"\xff", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc",
                b"\xed\xa0\x80", b"\xc0\xaf"):
        yield Case("invalid_utf8", COMPLETIONS, tuple(JSON.items()),
                   b'{"prompt": "a' + bad + b'", "max_tokens": 2}')
        yield Case("invalid_utf8", CHAT, tuple(JSON.items()),
                   b'{"messages": [{"role": "user", "content": "' + bad + b'"}]}')


def _control(rng, _v, _m):
    for code in list(range(0, 32, 3)) + [127]:
        if code in (9, 10, 13, 127):  # whitespace (and DEL) are legal outside strings
            continue
        raw = chr(code).encode()
        yield Case("control_characters", COMPLETIONS, tuple(JSON.items()),
                   b'{"prompt": "a' + raw + b'b", "max_tokens": 2}')


def _oversized(rng, _v, _m):
    for size in (5 << 20, 6 << 20):
        yield Case.json("oversized_bodies", COMPLETIONS, {"prompt": "a" * size})
    yield Case("oversized_bodies", COMPLETIONS, tuple(JSON.items()), b" " * (5 << 20) + b"{}")


def _messages(rng, _v, _m):
    bad_roles = ["robot", "", "USER", "tool_result", 7, None, ["user"]]
    for role in bad_roles:
        yield Case.json("bad_messages", CHAT, {"messages": [{"role": role, "content": "x"}]})
    for content in (7, {"text": "x"}, [{"type": "image_url", "image_url": {"url": "x"}}],
                    [{"type": "text"}], [{"type": "text", "text": 5}]):
        yield Case.json("bad_messages", CHAT, {"messages": [{"role": "user",
                                                             "content": content}]})
    for messages in ([], "hi", [{}], [{"role": "user"}], [{"role": "user", "content": "a",
                                                           "name": 5}]):
        yield Case.json("bad_messages", CHAT, {"messages": messages})


def _unsupported(rng, _v, _m):
    for name, value in UNSUPPORTED.items():
        for path in (COMPLETIONS, CHAT):
            yield Case.json("unsupported_fields", path, _base(path) | {name: value})


CATEGORIES = {
    "broken_json": _broken_json, "content_type": _content_types, "wrong_types": _wrong_types,
    "missing_required": _missing, "nulls": _nulls, "huge_negative_integers": _integers,
    "nan_inf": _nan_inf, "out_of_range_sampling": _out_of_range,
    "empty_enormous_prompts": _prompts, "token_ids_outside_vocab": _vocab,
    "nested_junk": _nested, "invalid_utf8": _utf8, "control_characters": _control,
    "oversized_bodies": _oversized, "bad_messages": _messages,
    "unsupported_fields": _unsupported,
}


def bad_requests(seed: int, vocab_size: int, max_model_len: int) -> list[Case]:
    """Every category's cases, deduplicated, in a seeded order."""
    rng, seen, cases = random.Random(seed), set(), []
    for make in CATEGORIES.values():
        for case in make(rng, vocab_size, max_model_len):
            key = (case.path, case.headers, case.body)
            if key not in seen:
                seen.add(key)
                cases.append(case)
    rng.shuffle(cases)
    return cases


def error_shape_ok(body: bytes) -> bool:
    """OpenAI's error shape, and nothing that looks like a Python traceback."""
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    text = body.decode("utf-8", "replace")
    return (isinstance(err, dict) and {"message", "type", "param", "code"} <= err.keys()
            and isinstance(err["message"], str) and "Traceback" not in text)


def run_fuzz(url: str, cases: list[Case], timeout: float = 30.0, api_key: str | None = None
             ) -> dict:
    """Send every case once; count, per category, what came back."""
    import httpx

    per: dict[str, dict[str, int]] = {}
    failures: list[dict] = []
    auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url, timeout=timeout) as client:
        for i, case in enumerate(cases):
            row = per.setdefault(case.category, {"sent": 0, "4xx": 0, "5xx": 0, "other": 0,
                                                 "bad_shape": 0, "no_response": 0})
            row["sent"] += 1
            try:
                r = client.post(case.path, content=case.body, headers=dict(case.headers) | auth)
            except httpx.HTTPError as e:  # a reset or a hang: the worst answer of all
                row["no_response"] += 1
                failures.append({"index": i, "category": case.category, "status": None,
                                 "body": case.body[:200].decode("utf-8", "replace"),
                                 "response": repr(e)})
                continue
            kind = "4xx" if 400 <= r.status_code < 500 else \
                "5xx" if r.status_code >= 500 else "other"
            row[kind] += 1
            shape = error_shape_ok(r.content)
            row["bad_shape"] += not shape
            if kind != "4xx" or not shape:
                failures.append({"index": i, "category": case.category,
                                 "status": r.status_code, "body": case.body[:200].decode(
                                     "utf-8", "replace"), "response": r.text[:300]})
        health = client.get("/health").status_code
        ok = client.post(COMPLETIONS, json={"prompt": "The for statement", "max_tokens": 3},
                         headers=auth)
    return {"cases": len(cases), "categories": per,
            "4xx": sum(r["4xx"] for r in per.values()),
            "5xx": sum(r["5xx"] for r in per.values()),
            "bad_shape": sum(r["bad_shape"] for r in per.values()),
            "no_response": sum(r["no_response"] for r in per.values()),
            "health_after": health, "valid_after": ok.status_code, "failures": failures}

"""Day 46 snapshot (frozen): one bad request per category, and the rule that judges the answer.

The live fuzzer (``nanoserve/bench/fuzz.py``) makes hundreds of cases from sixteen generators.
This is the same idea at its smallest, in the standard library: ``compact_cases`` returns one
representative case per category as ``(category, path, headers, body bytes)``, and
``error_shape_ok`` says whether a response is the answer a bad request must get: a 4xx whose
body is exactly OpenAI's error object, with ``code`` equal to the status and no traceback.

    >>> error_shape_ok(400, b'{"error": {"message": "bad", "type": "BadRequestError", '
    ...                     b'"param": null, "code": 400}}')
    True
    >>> error_shape_ok(500, b'{"error": {"message": "x", "type": "E", "param": null, '
    ...                     b'"code": 500}}')
    False
    >>> error_shape_ok(400, b'Traceback (most recent call last): ...')
    False
"""

from __future__ import annotations

import json

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
JSON = (("content-type", "application/json"),)

CATEGORIES = (
    "broken_json", "content_type", "wrong_types", "missing_required", "nulls",
    "huge_negative_integers", "nan_inf", "out_of_range_sampling", "empty_enormous_prompts",
    "token_ids_outside_vocab", "nested_junk", "invalid_utf8", "control_characters",
    "oversized_bodies", "bad_messages", "unsupported_fields",
)


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


def compact_cases(vocab_size: int, max_model_len: int, body_limit: int = 4 << 20
                  ) -> list[tuple[str, str, tuple, bytes]]:
    """One case per category, in ``CATEGORIES`` order."""
    deep = "[" * 5000 + "]" * 5000
    return [
        ("broken_json", COMPLETIONS, JSON, b'{"prompt": "The for", "max_tok'),
        ("content_type", COMPLETIONS, (("content-type", "text/plain"),),
         _j({"prompt": "The for"})),
        ("wrong_types", COMPLETIONS, JSON, _j({"prompt": "The for", "max_tokens": "seven"})),
        ("missing_required", CHAT, JSON, _j({"max_tokens": 3})),
        ("nulls", COMPLETIONS, JSON, _j({"prompt": None})),
        ("huge_negative_integers", COMPLETIONS, JSON, _j({"prompt": "a", "top_k": 10**30})),
        ("nan_inf", COMPLETIONS, JSON, b'{"prompt": "a", "temperature": NaN}'),
        ("out_of_range_sampling", COMPLETIONS, JSON, _j({"prompt": "a", "top_p": 1.0001})),
        ("empty_enormous_prompts", COMPLETIONS, JSON, _j({"prompt": [1] * max_model_len})),
        ("token_ids_outside_vocab", COMPLETIONS, JSON, _j({"prompt": [1, 2, vocab_size]})),
        ("nested_junk", COMPLETIONS, JSON, b'{"prompt": ' + deep.encode() + b"}"),
        ("invalid_utf8", COMPLETIONS, JSON, b'{"prompt": "a\xed\xa0\x80"}'),
        ("control_characters", COMPLETIONS, JSON, b'{"prompt": "a\x01b"}'),
        ("oversized_bodies", COMPLETIONS, JSON, _j({"prompt": "a" * (body_limit + 1)})),
        ("bad_messages", CHAT, JSON, _j({"messages": [{"role": "robot", "content": "x"}]})),
        ("unsupported_fields", CHAT, JSON,
         _j({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 10}})),
    ]


def error_shape_ok(status: int, body: bytes) -> bool:
    """A 4xx, exactly ``{"error": {"message", "type", "param", "code"}}``, code == status."""
    if not 400 <= status < 500 or b"Traceback" in body:
        return False
    try:
        obj = json.loads(body)
    except ValueError:
        return False
    if not isinstance(obj, dict) or set(obj) != {"error"} or not isinstance(obj["error"], dict):
        return False
    err = obj["error"]
    return (set(err) == {"message", "type", "param", "code"} and err["code"] == status
            and isinstance(err["message"], str) and err["message"] != ""
            and isinstance(err["type"], str) and (err["param"] is None
                                                  or isinstance(err["param"], str)))

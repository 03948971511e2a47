"""``StructuredOutputsParams``: what a request constrains its output to, checked at the door.

Why this module exists: vLLM's offline API takes ``SamplingParams(structured_outputs=
StructuredOutputsParams(json=..., regex=..., choice=..., grammar=...))`` and its server takes
OpenAI's ``response_format`` or vLLM's ``structured_outputs`` object; all of them end here, as
one frozen value with exactly one kind set. ``lark()`` is the spec as llguidance's grammar text;
``key`` is what the compile cache keys on.

JSON is generated without free whitespace by default (vLLM's ``disable_any_whitespace``): under
a grammar that allows any whitespace, a small model spends its probability on spaces and
newlines and never closes the object.

>>> StructuredOutputsParams(choice=["yes", "no"]).kind
'choice'
>>> StructuredOutputsParams(regex="a+", choice=["a"])  # doctest: +ELLIPSIS
Traceback (most recent call last):
nanoserve.validation.InvalidRequest: structured_outputs: give exactly one of ...; got regex, choice
"""

from __future__ import annotations

import json as _json
import re
from dataclasses import dataclass

from nanoserve.validation import InvalidRequest

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: dict | str | None = None  # a JSON schema, as a dict or its text
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None  # Lark (llguidance's) or GBNF/EBNF (``::=`` rules)
    json_object: bool = False  # any JSON object (OpenAI's {"type": "json_object"})
    disable_any_whitespace: bool = True
    strict: bool = False  # OpenAI's json_schema.strict: additionalProperties false where unset

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequest(f"structured_outputs: give exactly one of {', '.join(KINDS)}; "
                                 f"got {', '.join(given) or 'none'}", "structured_outputs")
        if self.choice is not None:
            if isinstance(self.choice, str) or not self.choice or \
                    not all(isinstance(c, str) and c for c in self.choice):
                raise InvalidRequest("structured_outputs.choice must be a non-empty list of "
                                     "non-empty strings", "structured_outputs")
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = _json.loads(schema)
                except ValueError as e:
                    raise InvalidRequest(f"structured_outputs.json is not JSON: {e}",
                                         "structured_outputs") from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequest("structured_outputs.json must be a JSON schema object",
                                     "structured_outputs")
            object.__setattr__(self, "json", schema)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequest(f"structured_outputs.{name} must be a non-empty string",
                                     "structured_outputs")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> str:
        """The compile cache's key: the kind, the spec as canonical text, the options."""
        value = getattr(self, self.kind)
        text = _json.dumps(value, sort_keys=True) if self.kind in ("json", "choice") \
            else str(value)
        return f"{self.kind}|{self.disable_any_whitespace}|{self.strict}|{text}"

    def schema(self) -> dict | bool:
        """The JSON schema to enforce (``json_object``: any object); ``strict`` closes every
        object that leaves ``additionalProperties`` unset."""
        schema = {"type": "object"} if self.json_object else self.json
        return _closed(schema) if self.strict else schema

    def lark(self) -> str:
        """The spec as llguidance grammar text."""
        from llguidance import LLMatcher
        from llguidance.gbnf_to_lark import any_to_lark

        if self.kind in ("json", "json_object"):
            return LLMatcher.grammar_from_json_schema(
                _json.dumps(self.schema()),
                defaults={"whitespace_flexible": not self.disable_any_whitespace})
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.regex)
        if self.kind == "choice":
            return LLMatcher.grammar_from_regex("|".join(re.escape(c) for c in self.choice))
        return LLMatcher.grammar_from_lark(any_to_lark(self.grammar))  # GBNF or Lark


def _closed(schema):
    """A copy of ``schema`` with ``additionalProperties: false`` on every object that has
    ``properties`` and says nothing about extra ones."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out

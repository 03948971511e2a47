"""Day 67's numbers: what the mask allows after ``{`` with and without free whitespace, where
the model's probability goes under each, fifty random schemas through the engine, the free rows
beside them, the refusals, and the frozen mask and rewrites against the package's.

Everything runs the shipped nanoserve-tiny in float32 through ``LLM`` and its engine; the
schemas come from ``nanoserve.testing.random_json_schema`` with seeds 0-49 and are validated by
``jsonschema``, which nanoserve did not write.
"""

from __future__ import annotations

import functools
import json
import random

from chapters.common import SHIPPED
from chapters.runner import exact

from .snapshot import mask as frozen

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
PROMPT = "Describe a person as JSON:"
PLAIN = ["The while statement", "Classes provide"]


@functools.cache
def llm():
    from nanoserve import LLM

    return LLM(SHIPPED, dtype="float32", max_num_seqs=8)


@functools.cache
def after_brace(any_whitespace: bool) -> dict:
    """The mask and the model's distribution at the token after ``{``."""
    import torch

    from nanoserve.structured.mask import allowed, fill
    from nanoserve.structured.params import StructuredOutputsParams

    model, tok = llm(), llm().tokenizer
    m = model.core.grammars().matcher(StructuredOutputsParams(
        json=SCHEMA, disable_any_whitespace=not any_whitespace))
    ids, brace = tok.encode(PROMPT), tok.encode("{", add_special_tokens=False)
    e = model.engine
    with torch.inference_mode():
        e.grant(0, len(ids) + len(brace) + 1)
        try:
            e.prefill([0], [ids])
            logits = e.decode([0], brace)  # one token: "{" is one token in this vocabulary
        finally:
            e.release(0)
    m.consume_tokens(brace)
    V = logits.shape[-1]
    ok = allowed(fill([m], V), V)[0]
    p = torch.softmax(logits[0].float(), -1)
    space = torch.tensor([tok.decode([i]).strip() == "" for i in range(V)])
    return {"allowed": int(ok.sum()), "space": int((ok & space).sum()),
            "space_mass": float(p[ok & space].sum() / p[ok].sum()),
            "top": tok.decode([int(torch.where(ok, p, 0).argmax())])}


def allowed_counts() -> str:
    c, f = after_brace(False), after_brace(True)
    return (f"compact: {c['allowed']} ({c['space']} whitespace); any whitespace: "
            f"{f['allowed']} ({f['space']} whitespace)")


def space_mass() -> str:
    f = after_brace(True)
    return f"{f['space_mass']:.1%}; the likeliest allowed token: {f['top']!r}"


@functools.cache
def fifty() -> dict:
    import jsonschema

    from nanoserve import SamplingParams
    from nanoserve.structured.params import StructuredOutputsParams
    from nanoserve.testing import random_json_schema

    schemas = [random_json_schema(random.Random(seed)) for seed in range(50)]
    alone = [o.text for o in llm().generate(PLAIN, SamplingParams(max_tokens=24,
                                                                  temperature=0))]
    params = [SamplingParams(max_tokens=256, temperature=0,
                             structured_outputs=StructuredOutputsParams(json=s))
              for s in schemas]
    outs = llm().generate([f"JSON {i}:" for i in range(50)] + PLAIN,
                          params + [SamplingParams(max_tokens=24, temperature=0)] * 2)
    ok = 0
    for s, o in zip(schemas, outs, strict=False):
        try:
            jsonschema.validate(json.loads(o.text), s)
            ok += o.finish_reason == "stop"
        except (ValueError, jsonschema.ValidationError):
            pass
    tokens = sum(len(o.token_ids) for o in outs[:50])
    return {"ok": ok, "tokens": tokens, "free": sum(a == o.text for a, o in
                                                     zip(alone, outs[50:], strict=True))}


def refusals() -> str:
    from nanoserve import SamplingParams
    from nanoserve.structured.params import StructuredOutputsParams
    from nanoserve.validation import InvalidRequest

    out = []
    for spec in (dict(json={"type": "nonsense"}), dict(json={"type": "string",
                                                             "format": "no-such-format"}),
                 dict(regex="a(b")):
        try:
            llm().generate(["x"], SamplingParams(structured_outputs=StructuredOutputsParams(
                **spec)))
        except InvalidRequest as e:
            out.append(f"{e.param}: " + str(e).split(": ", 2)[-1][:40].rstrip())
    return "; ".join(out)


def frozen_agrees() -> str:
    """The snapshot's unpacking and rewrites against the package's, on seeded inputs."""
    import torch

    from nanoserve.structured.mask import allowed
    from nanoserve.structured.params import StructuredOutputsParams, _closed

    g = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (64, 64), generator=g, dtype=torch.int64)
    words = words.to(torch.int32)
    rows = sum(torch.equal(a, b) for a, b in zip(frozen.unpack(words, 2048),
                                                 allowed(words, 2048), strict=True))
    from nanoserve.testing import random_json_schema

    schemas = [random_json_schema(random.Random(s)) for s in range(50)]
    same = sum(frozen.closed(s) == _closed(s) for s in schemas)
    spec = StructuredOutputsParams(choice=["a.b", "c"])
    regex = frozen.choice_regex(list(spec.choice)) == "a\\.b|c"
    return f"mask rows {rows} of 64; strict schemas {same} of 50; choice regex " + \
        ("equal" if regex else "differs")


CLAIMS = [
    exact("tokens allowed after `{`, a one-field schema, nanoserve-tiny", allowed_counts),
    exact("whitespace's share of the allowed probability after `{`, any-whitespace grammar, "
          "prompt 'Describe a person as JSON:'", space_mass),
    exact("50 seeded random schemas, greedy, 256 tokens at most: completions that end with "
          "stop and validate", lambda: f"{fifty()['ok']} of 50 ({fifty()['tokens']:,} tokens)"),
    exact("the 2 free-text rows batched beside them, against their text alone",
          lambda: f"{fifty()['free']} of 2 unchanged"),
    exact("three bad specs: what the refusal names", refusals),
    exact("the frozen mask and rewrites against the package's", frozen_agrees),
]

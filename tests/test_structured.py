"""Structured outputs (Day 67): every constrained completion is in the language it asked for.

The references are not ours: ``jsonschema`` validates every JSON completion against its schema,
Python's ``re.fullmatch`` checks every regex completion, and the unconstrained requests batched
beside them must say what they say alone. The schemas are drawn from a seeded generator over
the keywords the issue names (objects with required and nested fields, arrays with length
bounds, enums, consts, bounded integers and numbers, strings with length bounds or patterns),
closed (``additionalProperties: false``) so that a complete object can end.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from nanoserve import LLM, SamplingParams
from nanoserve.config import DEFAULT_MODEL
from nanoserve.structured.params import StructuredOutputsParams as Spec
from nanoserve.testing import random_json_schema
from nanoserve.validation import InvalidRequest

SCHEMAS = [random_json_schema(random.Random(seed)) for seed in range(50)]
PLAIN = ["The while statement", "Classes provide"]


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", max_num_seqs=8)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_fifty_random_schemas_parse_and_validate_beside_free_text(llm, sampled):
    alone = [o.text for o in llm.generate(PLAIN, SamplingParams(max_tokens=24, temperature=0))]
    params = [SamplingParams(max_tokens=256, temperature=0.8 if sampled else 0, seed=i,
                             structured_outputs=Spec(json=s)) for i, s in enumerate(SCHEMAS)]
    prompts = [f"JSON for {json.dumps(s)[:40]}:" for s in SCHEMAS]
    outs = llm.generate(prompts + PLAIN,
                        params + [SamplingParams(max_tokens=24, temperature=0)] * len(PLAIN))
    for schema, out in zip(SCHEMAS, outs, strict=False):
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)
    assert [o.text for o in outs[len(SCHEMAS):]] == alone  # unconstrained rows untouched
    pool = llm.core.scheduler.kv_cache_manager
    assert pool.num_free == pool.num_blocks


def test_regex_choice_and_grammar_match_whole(llm):
    specs = {r"[0-9]{3}-[a-z]{2,4}": Spec(regex=r"[0-9]{3}-[a-z]{2,4}"),
             "(yes|no|maybe)": Spec(choice=["yes", "no", "maybe"]),
             "a[bc]*d": Spec(grammar='root ::= "a" ("b" | "c")* "d"')}
    outs = llm.generate(["Code:", "Answer:", "G:"],
                        [SamplingParams(max_tokens=64, temperature=0, structured_outputs=s)
                         for s in specs.values()])
    for pattern, out in zip(specs, outs, strict=True):
        assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), out.text


def test_json_is_compact_by_default_and_strict_closes_objects(llm):
    open_schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                          "maximum": 9}}, "required": ["n"]}
    out = llm.generate(["JSON:"], SamplingParams(max_tokens=64, temperature=0,
                                                 structured_outputs=Spec(json=open_schema,
                                                                         strict=True)))[0]
    assert out.finish_reason == "stop" and set(json.loads(out.text)) == {"n"}
    assert not re.search(r"\s", out.text)  # no free whitespace
    assert Spec(json=open_schema, strict=True).schema()["additionalProperties"] is False


def test_preemption_does_not_change_constrained_text():
    specs = [Spec(regex=r"([a-z]{3} ){12,20}\."), Spec(json=SCHEMAS[0])] * 4
    params = [SamplingParams(max_tokens=40, temperature=0, structured_outputs=s) for s in specs]
    prompts = [f"Text {i}:" for i in range(8)]
    roomy = LLM(dtype="float32", max_num_seqs=8).generate(prompts, params)
    tight = LLM(dtype="float32", max_num_seqs=8, num_kv_blocks=12, block_size=4)
    cramped = tight.generate(prompts, params)
    assert tight.stats.preemptions > 0
    assert [o.text for o in cramped] == [o.text for o in roomy]


def test_a_grammar_that_cannot_finish_in_time_ends_with_length(llm):
    out = llm.generate(["x"], SamplingParams(max_tokens=3, temperature=0,
                                             structured_outputs=Spec(regex="[a-z]{10}")))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert re.fullmatch("[a-z]{1,9}", out.text)  # a prefix of the language, cut by the budget


@pytest.mark.parametrize("spec, words", [
    (dict(json={"type": "nonsense"}), "Invalid type"),
    (dict(json={"type": "string", "format": "no-such-format"}), "Unknown format"),
    (dict(regex="a(b"), "unclosed group"),
    (dict(grammar="root ::= ("), "grammar"),
    (dict(regex="a", choice=["a"]), "exactly one of"),
    (dict(choice=[]), "non-empty list"),
])
def test_bad_specs_are_refused_before_any_work(llm, spec, words):
    before = llm.engine.forward_passes
    with pytest.raises(InvalidRequest, match=words) as info:
        llm.generate(["x"], SamplingParams(structured_outputs=Spec(**spec)))
    assert info.value.param == "structured_outputs"
    assert llm.engine.forward_passes == before


def test_grammars_are_compiled_once_per_distinct_spec(llm):
    backend = llm.core.grammars()
    spec = Spec(choice=["left", "right"])
    before = backend.compiled
    llm.generate(["Go:"] * 4, SamplingParams(max_tokens=8, temperature=0,
                                             structured_outputs=spec))
    llm.generate(["Go:"], SamplingParams(max_tokens=8, temperature=0,
                                         structured_outputs=Spec(choice=["left", "right"])))
    assert backend.compiled == before + 1 and backend.hits >= 4


def test_the_server_takes_response_format_and_structured_outputs():
    import httpx
    import openai

    from nanoserve.bench.local_server import local_server
    from tests.server_fixture import error_of

    schema = SCHEMAS[3]
    with local_server(DEFAULT_MODEL, dtype="float32", max_num_seqs=4) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0,
                               timeout=60)
        model = client.models.list().data[0].id
        out = client.completions.create(  # the shipped model has no chat template
            model=model, prompt="Give me JSON:", max_tokens=200, temperature=0,
            extra_body={"response_format": {"type": "json_schema", "json_schema": {
                "name": "thing", "schema": schema, "strict": True}}})
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].text), schema)
        done = client.completions.create(model=model, prompt="Pick:", max_tokens=16,
                                         temperature=0,
                                         extra_body={"structured_outputs":
                                                     {"choice": ["red", "green", "blue"]}})
        assert done.choices[0].text in ("red", "green", "blue")
        obj = client.completions.create(model=model, prompt="JSON:", max_tokens=64,
                                        temperature=0,
                                        extra_body={"response_format": {"type": "json_object"}})
        assert isinstance(json.loads(obj.choices[0].text), dict) or \
            obj.choices[0].finish_reason == "length"
        stream = client.completions.create(  # n=2, streamed: each choice its own matcher
            model=model, prompt="Code:", max_tokens=32, temperature=0.9, seed=3, n=2,
            stream=True, extra_body={"structured_outputs": {"regex": "[a-z]{2,6}-[0-9]{2}"}})
        texts, reasons = ["", ""], [None, None]
        for chunk in stream:
            for c in chunk.choices:
                texts[c.index] += c.text
                reasons[c.index] = c.finish_reason or reasons[c.index]
        assert reasons == ["stop", "stop"], (texts, reasons)
        assert all(re.fullmatch("[a-z]{2,6}-[0-9]{2}", t) for t in texts), texts
        url = srv.url + "/v1/completions"
        bad = httpx.post(url, timeout=30, trust_env=False, json={
            "model": model, "prompt": "x",
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}})
        assert "response_format" == error_of(bad, 400)["param"]
        bad = httpx.post(url, timeout=30, trust_env=False, json={
            "model": model, "prompt": "x", "structured_outputs": {"regex": "a(b"}})
        assert "structured_outputs" == error_of(bad, 400)["param"]


def test_masks_apply_on_rank_zeros_gathered_logits_under_tensor_parallelism():
    schema = SCHEMAS[1]
    params = [SamplingParams(max_tokens=96, temperature=0, structured_outputs=Spec(json=schema))
              ] * 2 + [SamplingParams(max_tokens=24, temperature=0)] * 2
    prompts = ["A:", "B:", *PLAIN]
    one = LLM(dtype="float32").generate(prompts, params)
    with LLM(dtype="float32", tensor_parallel_size=2) as llm:
        two = llm.generate(prompts, params)
    assert [o.text for o in two] == [o.text for o in one]
    for out in two[:2]:
        jsonschema.validate(json.loads(out.text), schema)


def test_chunked_prefill_and_prefix_caching_leave_constrained_text_unchanged(llm):
    spec = Spec(json=SCHEMAS[5])
    prefix = "Shared context for every request, long enough to fill whole blocks. " * 6
    prompts = [prefix + f"Item {i}:" for i in range(6)]
    params = [SamplingParams(max_tokens=96, temperature=0, structured_outputs=spec)] * 3 + \
        [SamplingParams(max_tokens=24, temperature=0)] * 3
    plain = llm.generate(prompts, params)
    busy = LLM(dtype="float32", max_num_seqs=4, enable_prefix_caching=True,
               enable_chunked_prefill=True, max_num_batched_tokens=32)
    got = busy.generate(prompts, params)
    assert busy.stats.prefix_cache_hits > 0
    assert [o.text for o in got] == [o.text for o in plain]
    pool = busy.core.scheduler.kv_cache_manager
    assert pool.num_free == pool.num_blocks  # every block back, cached ones included


def test_ids_past_the_tokenizer_are_never_allowed():
    from nanoserve.structured.backend import GrammarBackend
    from nanoserve.structured.mask import allowed, fill
    from nanoserve.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    n = tok.tok.get_vocab_size()
    width = n + 100  # a model whose logits are wider than its tokenizer (padded vocabularies)
    backend = GrammarBackend.for_tokenizer(tok, width, [n - 1])
    for spec in (Spec(json_object=True), Spec(regex=".*"), Spec(grammar='root ::= [^"]*')):
        ok = allowed(fill([backend.matcher(spec)], width), width)[0]
        assert ok[:n].any() and not ok[n:].any(), spec.kind

"""``nanoserve serve --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'``,
driven by the official ``openai`` client: completions streamed and not, and a chat completion,
answer token for token what ``LLM`` writes offline without speculation (float32, greedy), and
``/metrics`` shows vLLM's speculative-decoding counters with drafts checked and accepted. A bad
``--speculative-config`` stops ``nanoserve serve`` before it loads anything, naming the flag.
The server is a real process on a free 127.0.0.1 port, started and stopped by ``local_server``.
"""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import openai
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nanoserve.bench.local_server import local_server
from nanoserve.cli import main
from nanoserve.config import DEFAULT_MODEL
from nanoserve.entrypoints.openai.metrics import ServerMetrics
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams
from nanoserve.spec_decode.stats import SpecDecodingStats

SPEC = '{"method": "ngram", "num_speculative_tokens": 4}'
# From the tiny model's own training text (pydoc's "class" topic): greedy, it goes on to write
# a long rule of dashes, which prompt lookup proposes and the target accepts.
PROMPT = ('Class definitions\n*****************\n\nA class definition defines a class object (see '
          'section The standard\ntype hierarchy):\n\n   classdef    ::= [decorators] "class" '
          'classname [inheritance] ":" suite\n   inheritance ::= "(" [argument_list] ")"\n   '
          'classname   ::= identifier\n\nA class definition is an executable statement.  The '
          'inheritance list\nusually gives a list of base classes (see Metaclasses for more\n'
          'advanced uses), so each item in the list should evaluate to a class\nobject which '
          'allows subclassing.  Classes without an inheritance list\ninherit, by default, from '
          'the base class "object"; hence,\n\n   class Foo:\n       pass\n\nis equivalent to\n\n'
          '   class Foo(object):\n       pass\n\n')
MAX_TOKENS = 48


def metrics(url: str) -> dict[tuple, float]:
    """Every sample on /metrics: (name, labels as sorted pairs) -> value."""
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def counter(samples: dict, name: str, **labels) -> float:
    hits = [v for (n, lbl), v in samples.items()
            if n == name and set(labels.items()) <= set(lbl)]
    assert len(hits) == 1, f"{name} {labels}: {len(hits)} samples on /metrics"
    return hits[0]


@pytest.fixture(scope="module")
def offline():
    """The same model without speculation: token ids in, greedy token ids out."""
    llm = LLM(DEFAULT_MODEL, dtype="float32")

    def run(prompt_ids: list[int]) -> list[int]:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        return llm.generate([prompt_ids], params)[0].token_ids

    yield run
    llm.shutdown()


def test_ngram_server_answers_as_without_speculation(offline):
    with local_server(DEFAULT_MODEL, dtype="float32",
                      extra_args=("--speculative-config", SPEC)) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0,
                               timeout=120)
        model = client.models.list().data[0].id
        assert counter(metrics(s.url), "nanoserve:spec_decode_num_drafts_total") == 0
        ids = {"return_token_ids": True}
        plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                          temperature=0, extra_body=ids)
        choice = plain.choices[0]
        assert choice.token_ids == offline(choice.prompt_token_ids)
        streamed = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                             temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}],
            max_tokens=MAX_TOKENS, temperature=0, extra_body=ids)
        assert chat.choices[0].token_ids == offline(chat.prompt_token_ids)
        m = metrics(s.url)
    drafts = counter(m, "nanoserve:spec_decode_num_drafts_total")
    draft_tokens = counter(m, "nanoserve:spec_decode_num_draft_tokens_total")
    accepted = counter(m, "nanoserve:spec_decode_num_accepted_tokens_total")
    per_pos = [counter(m, "nanoserve:spec_decode_num_accepted_tokens_per_pos_total",
                       position=str(p)) for p in range(4)]
    assert 0 < drafts and 0 < accepted <= draft_tokens <= 4 * drafts
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    assert ("nanoserve:spec_decode_num_accepted_tokens_per_pos_total",
            (("model_name", model), ("position", "4"))) not in m


def scrape(spec, k: int) -> dict[tuple, float]:
    """/metrics' engine counters over a stand-in engine whose snapshot holds ``spec``."""
    names = ("num_running", "num_waiting", "kv_cache_usage", "num_preemptions",
             "decode_steps_replayed", "decode_steps_scattered", "prefix_cache_queries",
             "prefix_cache_hits", "prefix_cache_evictions")
    snap = SimpleNamespace(**dict.fromkeys(names, 0), spec_decode=spec)
    proposer = SimpleNamespace(k=k) if spec is not None else None
    engine = SimpleNamespace(snapshot=lambda: snap, core=SimpleNamespace(proposer=proposer))
    text = generate_latest(ServerMetrics(engine, "tiny").registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_spec_counters_use_vllms_names_and_every_position():
    s = SpecDecodingStats()
    s.observe(4, 3)
    s.observe(2, 1)
    m = scrape(s, 4)
    assert counter(m, "nanoserve:spec_decode_num_drafts_total") == 2
    assert counter(m, "nanoserve:spec_decode_num_draft_tokens_total") == 6
    assert counter(m, "nanoserve:spec_decode_num_accepted_tokens_total") == 4
    assert [counter(m, "nanoserve:spec_decode_num_accepted_tokens_per_pos_total",
                    model_name="tiny", position=str(p)) for p in range(4)] == [2, 1, 1, 0]


def test_without_speculation_there_are_no_spec_counters():
    """vLLM registers the counters only when speculation is on; so does nanoserve."""
    m = scrape(None, 0)
    assert ("nanoserve:num_preemptions_total", (("model_name", "tiny"),)) in m
    assert not [name for name, _ in m if "spec_decode" in name]


@pytest.mark.parametrize("value, says", [
    ('{"method": "ngram", "num_speculative_tokens": 4', "is not JSON"),
    ('{"method": "ngram", "num_speculative_token": 4}', "unknown key 'num_speculative_token'"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
])
def test_a_bad_speculative_config_stops_serve_naming_the_flag(value, says, capsys):
    """Status 2 before any weight is read (``nanoserve serve``'s ``main``, in-process)."""
    code = main(["serve", "--model", str(DEFAULT_MODEL), "--port", "0",
                 "--speculative-config", value])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "nanoserve serve: error: --speculative-config:" in err and says in err

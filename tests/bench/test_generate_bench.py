"""Benchmarks (``make bench``): nanoserve against transformers' ``generate`` on the same
checkpoint and workload, measured in the same run. Never timed in ``make test``.

Workload: the shipped nanoserve-tiny checkpoint, fp32, batch size 1, a 5-token prompt,
64 greedy new tokens with EOS ignored. Hardware: the CUDA card where there is one, else the CPU;
each result carries it in ``extra_info["hardware"]`` and ``make bench`` prints it first.
"""

from __future__ import annotations

import pytest
import torch

from chapters.common import hardware
from nanoserve import LLM, SamplingParams
from nanoserve.llm import DEFAULT_MODEL

pytestmark = pytest.mark.bench
NEW_TOKENS = 64
PROMPT = "The for statement"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def llm():
    return LLM(DEFAULT_MODEL, dtype="float32", device=DEVICE)


def _label(benchmark) -> None:
    benchmark.extra_info.update(hardware=hardware(), device=DEVICE)


@pytest.mark.benchmark(group="generate-tiny-bs1-64tok")
def test_nanoserve_generate(benchmark, llm):
    _label(benchmark)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    out = benchmark(lambda: llm.generate([PROMPT], params)[0])
    assert len(out.token_ids) == NEW_TOKENS


@pytest.mark.benchmark(group="generate-tiny-bs1-64tok")
def test_transformers_generate(benchmark, llm):
    from nanoserve.testing import load_hf_model

    _label(benchmark)
    ref = load_hf_model(DEFAULT_MODEL).to(DEVICE)
    ids = torch.tensor([llm.tokenizer.encode(PROMPT)], device=DEVICE)

    def run():
        with torch.no_grad():
            return ref.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                do_sample=False, pad_token_id=0)

    out = benchmark(run)
    assert out.shape[1] == ids.shape[1] + NEW_TOKENS


@pytest.mark.benchmark(group="generate-tiny-bs1-64tok")
def test_nanoserve_generate_uncached(benchmark, llm):
    _label(benchmark)
    uncached = LLM(DEFAULT_MODEL, dtype="float32", device=DEVICE, enable_kv_cache=False)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    out = benchmark(lambda: uncached.generate([PROMPT], params)[0])
    assert len(out.token_ids) == NEW_TOKENS
    assert out.token_ids == llm.generate([PROMPT], params)[0].token_ids  # same tokens, cached

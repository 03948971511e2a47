"""``python -m nanoserve.bench.steps``: the step breakdown's counts, not its times.

Which steps a run takes depends only on the scheduler and the workload, so the counts are pinned
here exactly for the default workload (16 requests, 8 rows, the offline token budget); the
seconds are whatever the machine gives and are only checked to add up.
"""

from __future__ import annotations

import pytest

from nanoserve import LLM
from nanoserve.bench import steps
from nanoserve.bench.offline import workload_for
from nanoserve.llm import DEFAULT_MODEL


def test_kinds_and_the_refusal():
    assert steps.kind_of(512, 0) == "prefill" and steps.kind_of(130, 7) == "mixed"
    assert steps.kind_of(0, 3) == "decode 3"
    with pytest.raises(ValueError, match="computed nothing"):
        steps.kind_of(0, 0)


def test_the_default_run_steps_are_counted_exactly():
    wl, max_model_len = workload_for(DEFAULT_MODEL)  # bench offline's workload
    llm = LLM(DEFAULT_MODEL, dtype="float32", skip_tokenizer_init=True, max_num_seqs=8,
              max_model_len=max_model_len)
    inner = llm.engine.step
    b = steps.run(llm, wl)
    assert llm.engine.step == inner and "step" not in vars(llm.engine)  # unwrapped again
    counts = {name: (k.steps, k.tokens) for name, k in b.kinds.items()}
    assert counts == {"prefill": (1, 512), "mixed": (9, 1208), "decode 1": (20, 20),
                      "decode 2": (12, 24), "decode 3": (67, 201), "decode 4": (5, 20),
                      "decode 5": (11, 55), "decode 6": (1, 6), "decode 7": (2, 14),
                      "decode 8": (108, 864)}
    # every prompt token once, every output token but each request's first (its prompt's step)
    prompt_tokens = sum(len(p) for p in wl.prompts)
    assert sum(k.tokens for k in b.kinds.values()) == prompt_tokens + wl.useful_tokens - 16
    assert b.output_tokens == wl.useful_tokens == 1281
    assert 0 < b.step_seconds <= b.wall_s
    text = steps.report(b)
    assert "decode 8" in text and "1281 tokens" in text
    with steps.timed_steps(llm, lambda *a: None), pytest.raises(RuntimeError, match="already"):
        with steps.timed_steps(llm, lambda *a: None):
            pass
    assert "step" not in vars(llm.engine)

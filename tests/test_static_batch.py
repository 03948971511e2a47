"""LLM.generate over the paged cache, as static batches (Day 29) and through the scheduler
(Day 31): the same tokens as one request at a time, the pool full again after every call, and
each policy's bills counted."""

from __future__ import annotations

import pytest

from nanoserve import LLM, SamplingParams

RAGGED = [[0, 5, 9], [0, 7] * 9, [0], [0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [0, 11, 12],
          [0, 21] * 4, [0, 40, 41, 42, 43], [0, 99] * 15]


def _each_alone(llm, prompts, params):
    return [llm.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params, strict=True)]


@pytest.mark.parametrize("batching", ["static", "continuous"])
@pytest.mark.parametrize("which", ["shipped", "random"])
def test_eight_ragged_prompts_in_one_call_equal_each_alone(hf_checkpoint, which, batching):
    path = None if which == "shipped" else hf_checkpoint("gqa")
    llm = LLM(path, dtype="float32", block_size=4, max_num_seqs=8, batching=batching,
              skip_tokenizer_init=which == "random")
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=(i % 2 == 0))
              for i, m in enumerate([4, 9, 17, 2, 30, 5, 12, 8])]
    together = [o.token_ids for o in llm.generate(RAGGED, params)]
    assert together == _each_alone(llm, RAGGED, params)
    pool = llm.core.scheduler.kv_cache_manager
    pool.check_invariants()
    assert pool.num_free == pool.num_blocks


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_more_requests_than_slots(hf_checkpoint, batching):
    llm = LLM(hf_checkpoint("gqa"), dtype="float32", skip_tokenizer_init=True, max_num_seqs=3,
              block_size=4, batching=batching)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(RAGGED, params)
    passes, row_steps = llm.stats.forward_passes, llm.stats.row_steps  # this call only
    assert [o.token_ids for o in outs] == _each_alone(llm, RAGGED, [params] * len(RAGGED))
    # Equal budgets: both policies run 3 + 3 + 2 requests, six forwards each (a prefill and five
    # decode steps), and no row is computed after its last token.
    assert passes == 3 * 6
    assert row_steps == 8 * 6


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_a_small_pool_serves_everyone(hf_checkpoint, batching):
    """A pool that holds two worst cases at a time still serves eight requests."""
    llm = LLM(hf_checkpoint("gqa"), dtype="float32", skip_tokenizer_init=True, block_size=4,
              num_kv_blocks=16, batching=batching)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [[0, 1 + i, 2 + i] for i in range(8)]
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == _each_alone(llm, prompts, [params] * 8)


def test_day29_shape_counts(hf_checkpoint):
    """Eight requests, 5-token prompts, seven want 4 tokens and one wants 32, block_size 4."""
    llm = LLM(hf_checkpoint("gqa"), dtype="float32", skip_tokenizer_init=True, block_size=4,
              batching="static")
    prompts = [[0, 10 + i, 20, 30, 40] for i in range(8)]
    params = [SamplingParams(temperature=0, max_tokens=32 if i == 7 else 4, ignore_eos=True)
              for i in range(8)]
    outs = llm.generate(prompts, params)
    assert llm.stats.generated_tokens == 60
    assert llm.stats.forward_passes == 32  # one prefill (first token) + 31 decode steps
    assert llm.stats.row_steps == 8 * 32
    assert [o.finish_iteration for o in outs] == [4] * 7 + [32]
    first = outs[0].metrics
    assert first.last_token_time < first.finished_time == outs[7].metrics.finished_time


def test_day29_shape_through_the_scheduler(hf_checkpoint):
    """The same shape, scheduled: no finished row is computed, and r0 is back early."""
    llm = LLM(hf_checkpoint("gqa"), dtype="float32", skip_tokenizer_init=True, block_size=4)
    prompts = [[0, 10 + i, 20, 30, 40] for i in range(8)]
    params = [SamplingParams(temperature=0, max_tokens=32 if i == 7 else 4, ignore_eos=True)
              for i in range(8)]
    outs = llm.generate(prompts, params)
    assert llm.stats.iterations == 32
    assert llm.stats.row_steps == 60 == llm.stats.generated_tokens  # nothing wasted
    assert [o.finish_iteration for o in outs] == [4] * 7 + [32]
    assert outs[0].metrics.finished_time < outs[7].metrics.last_token_time


def test_door_check_refuses_what_the_pool_can_never_hold(hf_checkpoint):
    llm = LLM(hf_checkpoint("gqa"), dtype="float32", skip_tokenizer_init=True, block_size=4,
              num_kv_blocks=4)
    with pytest.raises(ValueError, match="prompt 1: prompt \\+ max_tokens = 17 tokens need 5 "
                                         "KV blocks; the pool has 4"):
        llm.generate([[1, 2], [1, 2, 3, 4]], SamplingParams(max_tokens=13))
    assert llm.core.scheduler.kv_cache_manager.num_free == 4


@pytest.mark.parametrize("kwargs,pattern", [
    ({"block_size": 0}, "block_size must be >= 1"),
    ({"max_num_seqs": 0}, "max_num_seqs must be >= 1"),
    ({"num_kv_blocks": 0}, "num_kv_blocks must be >= 1"),
])
def test_engine_options_are_checked(hf_checkpoint, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        LLM(hf_checkpoint("gqa"), skip_tokenizer_init=True, **kwargs)


def test_sixteen_prompts_with_ragged_budgets_through_the_scheduler(hf_checkpoint):
    """More requests than slots and a pool that cannot hold them all: rows are recycled
    mid-flight, and every request still gets exactly its one-at-a-time tokens."""
    llm = LLM(hf_checkpoint("llama3_rope"), dtype="float32", skip_tokenizer_init=True,
              block_size=4, max_num_seqs=5, num_kv_blocks=40)
    prompts = [[0, *range(3 + i, 3 + i + (i * 7) % 13 + 1)] for i in range(16)]
    params = [SamplingParams(temperature=0, max_tokens=1 + (i * 11) % 29, ignore_eos=True)
              for i in range(16)]
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == _each_alone(llm, prompts, params)
    assert [len(o.token_ids) for o in outs] == [p.max_tokens for p in params]
    pool = llm.core.scheduler.kv_cache_manager
    pool.check_invariants()
    assert pool.num_free == pool.num_blocks


def test_seeded_sampling_is_batch_independent(hf_checkpoint):
    """Per-request generators: a seeded request draws the same tokens alone or in a batch."""
    llm = LLM(hf_checkpoint("gqa"), dtype="float32", skip_tokenizer_init=True, block_size=4)
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_tokens=12,
                             ignore_eos=True) for s in range(6)]
    prompts = [[0, 5 + i, 9] for i in range(6)]
    together = [o.token_ids for o in llm.generate(prompts, params)]
    assert together == _each_alone(llm, prompts, params)

"""Snapshots are frozen: they import only the standard library, torch and earlier snapshots, and
the live package still produces what each snapshot produced."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from chapters.common import hf_checkpoint
from chapters.runner import all_chapters

SNAPSHOT_FILES = sorted(p for ch in all_chapters() for p in (ch / "snapshot").glob("*.py"))


def _day(path: Path) -> int:
    return int(next(part for part in path.parts if part.startswith("day"))[3:5])


@pytest.mark.parametrize("path", SNAPSHOT_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_snapshot_imports(path):
    allowed_third_party = {"torch"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside the same snapshot
                continue
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top == "chapters":
                parts = name.split(".")
                assert len(parts) >= 3 and parts[2] == "snapshot", f"{path}: imports {name}"
                assert _day(Path(*parts[:2])) < _day(path), f"{path}: imports a later day {name}"
            else:
                assert top in sys.stdlib_module_names or top in allowed_third_party or \
                    top == "__future__", f"{path}: imports {name}"


def test_package_model_equals_day1_snapshot():
    from chapters.day01_llama_forward.snapshot.weights import load_model as snap_load
    from nanoserve.model.weights import load_model

    path = hf_checkpoint("llama3_rope")
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(24)[None].expand(2, 24)
    a, b = load_model(path, "float32"), snap_load(path)
    with torch.no_grad():
        assert torch.equal(a.compute_logits(a(ids, pos)), b.compute_logits(b(ids, pos)))


def test_package_generation_equals_day4_and_day7_snapshots():
    from chapters.day01_llama_forward.snapshot.weights import load_model as snap_load
    from chapters.day04_generate.snapshot.generate import generate_uncached
    from chapters.day07_kv_cache.snapshot.generate import generate_cached
    from nanoserve import LLM, SamplingParams

    path = hf_checkpoint("gqa")
    prompt = list(range(3, 15))
    model = snap_load(path)
    live = LLM(path, dtype="float32", skip_tokenizer_init=True).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    assert generate_uncached(model, prompt, 24).token_ids == live.token_ids
    assert generate_cached(model, prompt, 24).token_ids == live.token_ids


def test_package_sampler_equals_day10_snapshot():
    from chapters.day10_sampling.snapshot import sampling as snap
    from nanoserve.sampling import sampler as live

    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(2))
    for kw in [dict(temperature=0), dict(temperature=0.7, top_k=10, top_p=0.9, seed=4)]:
        a, b = live.SamplingParams(**kw), snap.SamplingParams(**kw)
        out_a = live.sample(logits, [a] * 64, [a.make_generator()] * 64)
        out_b = snap.sample(logits, [b] * 64, [b.make_generator()] * 64)
        assert torch.equal(out_a, out_b)


def test_package_static_batch_equals_day29_snapshot():
    from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS, SHIPPED
    from chapters.day01_llama_forward.snapshot.weights import load_model as snap_load
    from chapters.day29_static_batch.snapshot.static_batch import run_static
    from nanoserve import LLM, SamplingParams

    snap = run_static(snap_load(SHIPPED), DAY29_PROMPTS, DAY29_MAX_TOKENS, 4, 64, 8)
    llm = LLM(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=8,
              batching="static")
    outs = llm.generate(DAY29_PROMPTS, [SamplingParams(temperature=0, max_tokens=m,
                                                       ignore_eos=True)
                                        for m in DAY29_MAX_TOKENS])
    assert [o.token_ids for o in outs] == [r.token_ids for r in snap.replies]
    assert (llm.stats.forward_passes, llm.stats.row_steps, llm.stats.generated_tokens) == \
        (snap.forward_passes, snap.issued, snap.useful)
    assert [o.finish_iteration for o in outs] == [r.finish_iteration for r in snap.replies]


@pytest.mark.parametrize("slots,pool,gen,n", [(8, 1024, [4, 4, 4, 4, 4, 4, 4, 32], 24),
                                              (4, 48, [24], 4), (3, 64, [1, 9, 2, 30], 11)])
def test_package_harness_equals_day30_snapshot(slots, pool, gen, n):
    from chapters.day30_state_machine.snapshot import harness as snap
    from nanoserve.bench import schedbench as live

    now, then = live.run_scheduled(slots, 4, pool, 5, gen, n), snap.run_scheduled(slots, 4, pool,
                                                                                 5, gen, n)
    shared = then.keys() - {"peak_reservation_waste"}  # later days add keys; these stay
    assert {k: now[k] for k in shared} == {k: then[k] for k in shared}
    assert live.run_static(slots, 5, gen, n) == snap.run_static(slots, 5, gen, n)


def test_package_scheduled_loop_equals_day31_snapshot():
    from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS, SHIPPED
    from chapters.day01_llama_forward.snapshot.weights import load_model as snap_load
    from chapters.day31_engine.snapshot.scheduled import run_scheduled
    from nanoserve import LLM, SamplingParams

    snap = run_scheduled(snap_load(SHIPPED), DAY29_PROMPTS, DAY29_MAX_TOKENS, 4, 64, 8)
    llm = LLM(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=8)
    outs = llm.generate(DAY29_PROMPTS, [SamplingParams(temperature=0, max_tokens=m,
                                                       ignore_eos=True)
                                        for m in DAY29_MAX_TOKENS])
    assert [o.token_ids for o in outs] == [r.token_ids for r in snap.replies]
    assert (llm.stats.row_steps, llm.stats.generated_tokens) == (snap.issued, snap.useful)
    assert [o.finish_iteration for o in outs] == [r.finish_iteration for r in snap.replies]


@pytest.mark.parametrize("pool", [48, 96, 128])
@pytest.mark.parametrize("policy", ["reserve", "incremental"])
def test_package_harness_equals_day33_snapshot(pool, policy):
    from chapters.day33_preemption.snapshot import harness as snap
    from nanoserve.bench import schedbench as live

    assert live.run_scheduled(4, 4, pool, 5, [24], 4, policy) == \
        snap.run_scheduled(4, 4, pool, 5, [24], 4, policy)

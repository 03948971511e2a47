"""Thread binding (threads.py, csrc/threads.cpp): what a spec means, that the OpenMP team really
lands on the planned CPUs, that LLM gives its caller the old mask back, and that AsyncLLM's
engine thread is the one pinned."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.async_engine import AsyncLLM
from nanoserve.cpu.csrc import load
from nanoserve.cpu.threads import Binding, parse_cpus, physical_cores, pinned, plan

NO_OPS = load()
needs_ops = pytest.mark.skipif(NO_OPS is not None, reason=f"no C++ ops: {NO_OPS}")
ALLOWED = sorted(os.sched_getaffinity(0))


def test_parse_cpus():
    assert parse_cpus("0-3,8") == [0, 1, 2, 3, 8]
    assert parse_cpus("5") == [5]
    for bad, why in [("x", "not a CPU"), ("3-1", "backwards"), ("1,1", "twice"), ("", "not")]:
        with pytest.raises(ValueError, match=why):
            parse_cpus(bad)


def test_bad_specs_are_refused_by_name():
    with pytest.raises(ValueError, match="threads_bind"):
        LLM(threads_bind="zero")
    with pytest.raises(ValueError, match="not among"):
        plan(f"{max(ALLOWED) + 1}")


def test_physical_cores_skip_siblings(tmp_path):
    """Two cores with two hyperthreads each (CPUs 0/2 and 1/3): one CPU per core."""
    for cpu, core in {0: 0, 1: 1, 2: 0, 3: 1}.items():
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    assert physical_cores({0, 1, 2, 3}, tmp_path) == [0, 1]
    assert physical_cores({2, 3}, tmp_path) == [2, 3]


def test_nobind_and_cuda_bind_nothing():
    assert plan("nobind").cpus == ()
    assert "CPU setting" in plan("auto", "cuda").reason


@needs_ops
def test_auto_is_one_thread_per_core():
    b = plan("auto")
    assert len(b.cpus) == min(torch.get_num_threads(), len(physical_cores(set(ALLOWED))))
    assert set(b.cpus) <= set(ALLOWED) and "pinned" in b.describe()


@needs_ops
def test_each_thread_lands_on_its_cpu():
    """Run in a fresh thread so the pytest thread's own mask is left alone."""
    got = {}

    def run():
        cpus = list(reversed(ALLOWED))
        got["ran_on"] = list(torch.ops.nanoserve.bind_threads(cpus))
        got["want"] = cpus
        got["mask"] = os.sched_getaffinity(0)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert got["ran_on"] == got["want"] and got["mask"] == {got["want"][0]}


@needs_ops
def test_generate_pins_then_restores_the_caller():
    mine, threads = os.sched_getaffinity(0), torch.get_num_threads()
    llm = LLM(dtype="float32", threads_bind=str(ALLOWED[-1]))
    assert llm.binding.cpus == (ALLOWED[-1],)
    seen = []
    real = llm.engine.decode

    def spy(*a, **k):
        seen.append((os.sched_getaffinity(0), torch.get_num_threads()))
        return real(*a, **k)
    llm.engine.decode = spy
    llm.generate([[0, 5, 9]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert seen and all(s == ({ALLOWED[-1]}, 1) for s in seen)
    assert os.sched_getaffinity(0) == mine and torch.get_num_threads() == threads


@needs_ops
def test_pinned_without_cpus_is_a_no_op():
    mine = os.sched_getaffinity(0)
    with pinned(Binding((), "nobind")):
        assert os.sched_getaffinity(0) == mine


@needs_ops
def test_async_engine_thread_is_pinned():
    engine = AsyncLLM.from_options(dtype="float32", threads_bind=str(ALLOWED[0]))
    mask = {}
    real = engine.core.step

    def spy():
        mask.setdefault("engine", os.sched_getaffinity(0))
        return real()
    engine.core.step = spy

    async def go():
        params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        async for _ in engine.generate([0, 5], params, "r0"):
            pass
    import asyncio
    mine = os.sched_getaffinity(0)
    engine.start()
    try:
        asyncio.run(go())
    finally:
        asyncio.run(engine.shutdown(5))
    assert mask["engine"] == {ALLOWED[0]} and os.sched_getaffinity(0) == mine

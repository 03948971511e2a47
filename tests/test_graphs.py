"""Recorded decode windows (Day 57), the speed flags (Day 56, 58) and make gpu-check.

On a CPU the windows replay eagerly over the same static buffers a CUDA graph would hold, so
everything but the capture is tested here: the copy-in, the padding to a bucket, the read-out,
the address check, the counters, and greedy tokens identical to the eager forward in float32,
through preemption and compaction, on a random transformers checkpoint and on the shipped
model. The ``gpu`` tests capture on a card and hold the replay against the eager forward there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from log_tables import LOG_COVERAGE
from server_fixture import ServerThread, wait_for

from nanoserve.async_engine import AsyncLLM
from nanoserve.bench import graphbench
from nanoserve.config import EngineConfig
from nanoserve.cuda import graphs
from nanoserve.cuda.graphs import DecodeGraphs, ReplayCounters, bucket_for, capture_sizes
from nanoserve.entrypoints.openai.app import build_app
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(dtype="float32", skip_tokenizer_init=True, block_size=4, max_num_seqs=4,
            max_model_len=64)
PROMPTS = [[0, *range(3 + i, 7 + i + i % 3)] for i in range(6)]
PARAMS = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(6)]
CRAMPED = 8  # KV blocks of 4 tokens: the six requests preempt each other three times


def tokens(llm: LLM) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]


# ------------------------------------------------------------------ the capture list


def test_capture_sizes_and_buckets():
    assert capture_sizes(1) == [1]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(12) == [1, 2, 4, 8, 12]
    sizes = capture_sizes(8)
    assert [bucket_for(n, sizes) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert bucket_for(9, sizes) is None
    with pytest.raises(ValueError):
        capture_sizes(0)


def test_rows_are_a_prefix_is_compacts_question(monkeypatch):
    asked = []

    def spy(rows):
        asked.append(list(rows))
        return True

    monkeypatch.setattr(graphs, "is_compact", spy)
    assert graphs.rows_are_a_prefix([2, 0, 1]) is True and asked == [[2, 0, 1]]
    monkeypatch.undo()
    assert graphs.rows_are_a_prefix([1, 0]) and not graphs.rows_are_a_prefix([0, 2])


def test_counters_say_what_happened():
    c = ReplayCounters()
    assert (c.decode_steps, c.replayed, c.scattered, c.share) == (0, 0, 0, 0.0)
    for replayed in (True, True, False):
        c.count(replayed)
    assert (c.decode_steps, c.replayed, c.scattered) == (3, 2, 1)
    assert repr(c) == "ReplayCounters(decode_steps=3, replayed=2, scattered=1, share=67%)"


# ------------------------------------------------------------------ tokens, graphs on and off


@pytest.fixture(scope="module")
def checkpoint(hf_checkpoint):
    return hf_checkpoint("gqa")


@pytest.fixture(scope="module")
def baseline(checkpoint):
    """Graphs off, free rows, a roomy pool: the eager forward's greedy tokens, per model and
    read, made on first use."""
    out = {}

    def get(model: str, attention: str) -> list[list[int]]:
        if (model, attention) not in out:
            path = checkpoint if model == "random" else None
            out[model, attention] = tokens(LLM(path, compact_rows=False, attention=attention,
                                               **TINY))
        return out[model, attention]

    return get


@pytest.mark.parametrize("model,attention,num_kv_blocks", [
    ("random", "gathered", None), ("random", "gathered", CRAMPED),
    ("random", "reference", None), ("random", "reference", CRAMPED),
    ("shipped", "gathered", CRAMPED),
])
def test_windows_are_token_identical_to_the_forward(baseline, checkpoint, model, attention,
                                                    num_kv_blocks):
    llm = LLM(checkpoint if model == "random" else None, cuda_graphs=True, attention=attention,
              num_kv_blocks=num_kv_blocks, **TINY)
    assert llm.compact_rows is True and llm.engine.graphs.mode == "eager replay"
    assert tokens(llm) == baseline(model, attention)
    s = llm.stats
    assert s.decode_steps > 0 and s.decode_steps_replayed == s.decode_steps
    assert s.decode_steps_scattered == 0 and s.replay_share == 1.0
    assert llm.core.scheduler.compactor.moves > 0
    if num_kv_blocks is not None:
        assert s.preemptions > 0
    assert all(len(t) == 0 for t in llm.engine.cache.tables)


def test_free_rows_scatter_and_still_agree(baseline, checkpoint):
    llm = LLM(checkpoint, cuda_graphs=True, compact_rows=False, **TINY)
    assert tokens(llm) == baseline("random", "gathered")
    s = llm.stats
    assert s.decode_steps == s.decode_steps_replayed + s.decode_steps_scattered
    assert s.decode_steps_scattered > 0 and s.decode_steps_replayed > 0
    assert 0 < s.replay_share < 1
    e = llm.engine
    assert e.graphs.replays == e.replay_counters.replayed == s.decode_steps_replayed


def test_graphs_off_count_every_decode_step_as_scattered(checkpoint):
    llm = LLM(checkpoint, **TINY)
    tokens(llm)
    s = llm.stats
    assert llm.engine.graphs is None and s.decode_steps > 0
    assert (s.decode_steps_replayed, s.decode_steps_scattered) == (0, s.decode_steps)


def test_cuda_graphs_on_a_cpu_never_raises_and_static_batches_fall_through(checkpoint):
    llm = LLM(checkpoint, cuda_graphs=True, batching="static", **TINY)
    out = llm.generate(PROMPTS[:3], PARAMS[:3])
    assert all(len(o.token_ids) == p.max_tokens for o, p in zip(out, PARAMS, strict=False))
    s = llm.stats  # a wave's held rows cannot replay; the steps before the first finish can
    assert s.decode_steps_scattered > 0 and s.decode_steps_replayed > 0


# ------------------------------------------------------------------ the window, step by step


def three_rows(checkpoint, attention="gathered"):
    """An engine with requests prefilled into rows 0, 1 and 2 of four, graphs on."""
    llm = LLM(checkpoint, cuda_graphs=True, attention=attention, **TINY)
    e = llm.engine
    lists = [[0, 5, 9], [0, 7, 8, 9, 10, 11], [0, 3]]
    for row, toks in enumerate(lists):
        e.grant(row, len(toks) + 4)
    e.prefill([0, 1, 2], lists)
    return llm, e


@pytest.mark.parametrize("attention", ["gathered", "reference"])
def test_three_rows_pad_to_four_and_pad_rows_touch_nothing(checkpoint, attention):
    llm, e = three_rows(checkpoint, attention)
    g = e.graphs
    with torch.inference_mode():
        k, v, slots = e.cache.k.clone(), e.cache.v.clone(), e.cache.slots.cells.clone()
        want = e._forward([2, 0, 1], [[4], [6], [12]])  # the eager forward, on a copy below
        e.cache.k.copy_(k)
        e.cache.v.copy_(v)
        e.cache.slots.cells.copy_(slots)
        for row in (0, 1, 2):
            e.cache.lengths[row] -= 1
        got = e.decode([2, 0, 1], [4, 6, 12])
    assert g.replays == 1 and g.padded_rows == 1 and g.by_bucket[4] == 1
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert e.cache.lengths[:4] == [4, 7, 3, 0]
    assert bool((e.cache.slots.cells[3] == -1).all())  # the pad row addressed nothing
    written = sorted(e.cache.tables[r].cells(n - 1, n)[0] for r, n in ((0, 4), (1, 7), (2, 3)))
    changed = (e.cache.k != k).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
    assert changed == written  # only the three real rows' new cells


def test_static_buffers_never_move(checkpoint):
    llm, e = three_rows(checkpoint)
    g = e.graphs
    before = g.buffers.addresses()
    with torch.inference_mode():
        e.decode([0, 1, 2], [1, 2, 3])
        e.decode([0, 1, 2], [1, 2, 3])
    assert g.buffers.addresses() == before and g.replays == 2
    g.buffers.hidden = g.buffers.hidden.clone()  # what a careless resize would do
    with pytest.raises(AssertionError, match="moved"), torch.inference_mode():
        e.decode([0, 1, 2], [1, 2, 3])


def test_a_window_refuses_rows_that_are_not_a_prefix(checkpoint):
    llm, e = three_rows(checkpoint)
    with pytest.raises(ValueError, match="cannot replay"):
        e.graphs.replay([0, 2], [1, 2])
    with torch.inference_mode():
        e.decode([0, 2], [1, 2])  # the engine asks first, and falls through instead
    assert e.replay_counters.scattered == 1 and e.graphs.replays == 0


def test_capture_needs_a_card(checkpoint):
    llm = LLM(checkpoint, **TINY)
    with pytest.raises(ValueError, match="CUDA"):
        DecodeGraphs(llm.model, llm.engine.cache, 4, capture=True)
    with pytest.raises(ValueError, match="capture sizes"):
        DecodeGraphs(llm.model, llm.engine.cache, 4, sizes=[1, 8])


# ------------------------------------------------------------------ the flags


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    EngineConfig.add_cli_args(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("argv,graphs_on,compact", [
    ((), False, False), (("--cuda-graphs",), True, True),
    (("--cuda-graphs", "--no-persistent-batch"), True, False),
    (("--persistent-batch",), False, True), (("--no-persistent-batch",), False, False),
])
def test_persistent_batch_is_tri_state(argv, graphs_on, compact):
    args = parse(*argv)
    assert args.compact_rows in (None, True, False)
    cfg = EngineConfig.from_cli_args(args)
    assert (cfg.cuda_graphs, cfg.persistent_batch) == (graphs_on, compact)


def test_speed_flags_parse_unbundled():
    cfg = EngineConfig.from_cli_args(parse("--no-compile", "--attention", "reference"))
    assert (cfg.compile, cfg.attention) == (False, "reference")
    assert EngineConfig.from_cli_args(parse("--compile")).compile is True
    assert EngineConfig.from_cli_args(parse()).attention == "auto"


def test_build_engine_threads_each_option(checkpoint):
    engine = AsyncLLM.from_options(checkpoint, cuda_graphs=True, attention="reference", **TINY)
    core = engine.core
    assert core.engine.graphs is not None and core.engine.cache.attention == "reference"
    assert core.scheduler.compact_rows is True  # None follows the graphs
    engine = AsyncLLM.from_options(checkpoint, cuda_graphs=True, compact_rows=False, **TINY)
    assert engine.core.scheduler.compact_rows is False
    assert engine.core.scheduler.compactor.mode == "free"


def test_a_graphed_server_serves_the_offline_tokens_and_counts_them():
    prompts = [[0, 11, 12, 13], [0, 5], [0, 9, 9, 9, 9, 9]]
    lens = [12, 5, 9]
    offline = LLM(dtype="float32", max_model_len=64).generate(
        prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens])
    engine = AsyncLLM.from_options(None, cuda_graphs=True, dtype="float32", max_model_len=64)
    with ServerThread(build_app(engine, "tiny")) as s:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            texts = [c.post("/v1/completions", json={
                "prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True}).json()
                ["choices"][0]["text"] for p, n in zip(prompts, lens, strict=True)]
            wait_for(lambda: engine.num_running == 0, what="idle")
            page = c.get("/metrics").text
    assert texts == [o.text for o in offline]
    counts = graphbench.replay_counters(page)
    snap = engine.snapshot()
    assert counts["replayed"] == snap.decode_steps_replayed > 0
    assert counts["scattered"] == snap.decode_steps_scattered == 0
    assert "nanoserve:decode_steps_replayed_total{" in page
    assert "nanoserve:decode_steps_scattered_total{" in page


# ------------------------------------------------------------------ the arms and gpu-check


def test_one_arm_over_sockets_on_a_cpu_says_eager_replay():
    report = graphbench.run_arms(str(ROOT / "nanoserve" / "checkpoints" / "nanoserve-tiny"),
                                 "cpu", [float("inf")], arms=("graphs-no-compile",), requests=4,
                                 input_len=8, output_len=6, max_num_seqs=4, max_model_len=64,
                                 dtype="float32")
    assert report["windows"].startswith("eager replay")
    (row,) = report["rows"]
    assert row["failed"] == 0 and row["replayed"] == row["decode_steps"] > 0
    assert row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert report["gates"]["graphs-no-compile"].startswith("PASS")
    assert "itl p50 ms" in graphbench.render_arms(report)


def test_run_arms_refuses_what_it_cannot_run(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        graphbench.run_arms(str(tmp_path), "cpu", [1.0])
    tiny = str(ROOT / "nanoserve" / "checkpoints" / "nanoserve-tiny")
    with pytest.raises(ValueError, match="arms"):
        graphbench.run_arms(tiny, "cpu", [1.0], arms=("warp-speed",))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            graphbench.run_arms(tiny, "cuda", [1.0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a card gpu-check really runs")
def test_make_gpu_check_on_a_cpu_says_what_it_would_run_and_fails():
    r = subprocess.run(["make", "-s", "gpu-check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    said = r.stdout + r.stderr
    assert r.returncode != 0
    assert "no CUDA device" in said and "would run" in said
    for stage in ("wheels", "gpu tests", "weights", "arms"):
        assert stage in said


def test_gpu_check_plan_names_its_results(tmp_path):
    r = subprocess.run([sys.executable, "tools/gpu_check.py", "--plan",
                        "--results", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "graphbench" in r.stdout and str(tmp_path) in r.stdout


# ------------------------------------------------------------------ on a card


def cuda_llm(**kw) -> LLM:
    return LLM(device="cuda", dtype="float32", skip_tokenizer_init=True, block_size=16,
               max_num_seqs=8, max_model_len=256, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["gathered", "reference"])
def test_gpu_capture_replays_the_eager_tokens(attention):
    eager = tokens(cuda_llm(attention=attention, compact_rows=True))
    llm = cuda_llm(attention=attention, cuda_graphs=True)
    g = llm.engine.graphs
    assert g.mode == "cuda graphs" and sorted(g.graphs) == [1, 2, 4, 8]
    before = g.buffers.addresses()
    assert tokens(llm) == eager
    assert llm.stats.decode_steps_replayed == llm.stats.decode_steps > 0
    assert g.buffers.addresses() == before


@pytest.mark.gpu
def test_gpu_replay_equals_the_eager_forward_step_by_step():
    llm = cuda_llm(cuda_graphs=True)
    e = llm.engine
    lists = [[0, 5, 9], [0, 7, 8, 9, 10, 11], [0, 3]]
    for row, toks in enumerate(lists):
        e.grant(row, len(toks) + 4)
    with torch.inference_mode():
        e.prefill([0, 1, 2], lists)
        k, v = e.cache.k.clone(), e.cache.v.clone()
        slots = e.cache.slots.cells.clone()
        want = e._forward([0, 1, 2], [[4], [6], [12]])
        e.cache.k.copy_(k)
        e.cache.v.copy_(v)
        e.cache.slots.cells.copy_(slots)
        for row in (0, 1, 2):
            e.cache.lengths[row] -= 1
        got = e.decode([0, 1, 2], [4, 6, 12])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert e.graphs.padded_rows == 1


@pytest.mark.gpu
def test_gpu_capture_in_bf16_serves_a_cramped_pool():
    kw = dict(device="cuda", dtype="bfloat16", skip_tokenizer_init=True, block_size=4,
              max_num_seqs=4, max_model_len=64, num_kv_blocks=CRAMPED)
    llm = LLM(cuda_graphs=True, **kw)
    out = tokens(llm)
    assert [len(t) for t in out] == [p.max_tokens for p in PARAMS]
    assert llm.stats.preemptions > 0 and llm.stats.replay_share == 1.0


def test_gpu_check_writes_weights_the_loader_reads(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import gpu_check

    from nanoserve.bench.shapes import SHAPES

    cfg = dict(SHAPES["llama-3.2-1b"], vocab_size=512, hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    info = gpu_check.write_weights(tmp_path, cfg=cfg, device="cpu")
    assert info["shape"] == "custom" and info["dtype"] == "bfloat16"
    llm = LLM(tmp_path, dtype="bfloat16", max_model_len=32, cuda_graphs=True)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4 and out[0].text.strip().startswith("t")




def test_coverage_prints_the_logs_table_to_the_character(capsys, tmp_path):
    from nanoserve.cli import main

    assert main(["bench", "graph", "--coverage", "--csv", str(tmp_path / "c.csv")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1:18] == LOG_COVERAGE.splitlines()

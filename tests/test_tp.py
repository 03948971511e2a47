"""Tensor parallelism (Days 64-66): ``-tp 2`` says what ``-tp 1`` says, and fails cleanly.

The references are the one-rank engine on the same checkpoint (the shipped model and
transformers-written ones that need KV heads replicated, a padded vocabulary and biases) and
the checkpoint's own tensors read whole. Every engine with ``tensor_parallel_size=2`` spawns one
worker process on 127.0.0.1 over a private gloo group on a free port; every test stops its
engines in a ``with`` block or a ``finally``, and checks that no worker outlives them. Waits are
bounded by ``distributed_timeout_s`` and the fixtures' timeouts.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors import safe_open

from nanoserve import LLM, SamplingParams
from nanoserve.attention.paged import BatchedPagedKVCache
from nanoserve.config import DEFAULT_MODEL, EngineConfig, ModelConfig
from nanoserve.engine.engine import EngineBroken
from nanoserve.testing import greedy_logits
from nanoserve.tp import mirror, protocol
from nanoserve.tp.load import read_slices
from nanoserve.tp.shard import ShardPlan

GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
PROMPTS = ["The while statement", "Once upon a time there was", "def f(x):", "A list is",
           "import os\nimport sys\n", "class Stack:", "The quick brown fox jumps over", "x = 1"]
# Logits of -tp 2 against -tp 1 in float32: the all-reduce sums partial products in another
# order, so they may differ by rounding; measured on these checkpoints well under this bound.
LOGIT_BOUND = 1e-4


def alive_workers() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("nanoserve-tp")]


def pair(model=DEFAULT_MODEL, prompts=PROMPTS, params=GREEDY, **kw):
    """The same prompts through one rank and through two: (outputs, outputs, tp=2's LLM stats)."""
    one = LLM(model, dtype="float32", **kw).generate(prompts, params)
    with LLM(model, dtype="float32", tensor_parallel_size=2, **kw) as llm:
        two = llm.generate(prompts, params)
        stats, engine, kv = llm.stats, llm.engine, llm.core.scheduler.kv_cache_manager
        assert kv.num_free == kv.num_blocks
    assert not alive_workers()
    return one, two, stats, engine


# ---------------------------------------------------------------------- the split (Day 64)

@pytest.fixture(scope="module")
def odd_checkpoint(hf_checkpoint):
    """Biases on every linear, 2 KV heads over 2 ranks, an odd vocabulary (255 rows)."""
    return hf_checkpoint("bias", vocab_size=255, eos_token_id=254)


def test_each_rank_reads_its_slice_and_the_slices_make_the_whole(odd_checkpoint):
    cfg = ModelConfig.from_dir(odd_checkpoint)
    plans = [ShardPlan(cfg, 2, r) for r in range(2)]
    parts = [read_slices(odd_checkpoint, p) for p in plans]
    whole = {}
    with safe_open(next(odd_checkpoint.glob("*.safetensors")), framework="pt") as f:
        for name in f.keys():
            whole[name] = f.get_tensor(name)
    assert sum(n for _, n in parts) < 1.2 * sum(t.numel() * 4 for t in whole.values())
    for name, full in whole.items():
        a, b = parts[0][0][name], parts[1][0][name]
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            assert torch.equal(torch.cat([a, b], dim=1), full), name
        elif name.endswith(("o_proj.bias", "down_proj.bias")):  # added once, by rank 0
            assert torch.equal(a, full) and not b.any(), name
        elif "layernorm" in name or name == "model.norm.weight":
            assert torch.equal(a, full) and torch.equal(b, full), name
        else:  # rows: heads, MLP columns, the vocabulary (padded to an even split)
            joined = torch.cat([a, b])
            assert torch.equal(joined[:len(full)], full), name
            assert not joined[len(full):].any(), name
    assert plans[1].vocab_pad == 1 and plans[1].vocab_rows == (128, 255)


def test_a_shape_that_cannot_be_split_is_refused_before_any_worker(hf_checkpoint):
    cfg = ModelConfig.from_dir(DEFAULT_MODEL)  # 8 query heads, 4 KV heads, MLP 688
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide "
                                         "intermediate_size=688"):
        ShardPlan(cfg, 3, 0)
    with pytest.raises(ValueError, match="tensor_parallel_size=6 is above "
                                         "num_key_value_heads=4"):
        ShardPlan(dataclasses.replace(cfg, intermediate_size=696), 6, 0)
    with pytest.raises(ValueError, match="intermediate_size=688"):
        LLM(dtype="float32", tensor_parallel_size=3)
    assert not alive_workers()
    one_kv = ShardPlan(ModelConfig.from_dir(hf_checkpoint("gqa", num_key_value_heads=1)), 2, 1)
    assert one_kv.replicated_kv and "replicated" in one_kv.describe()
    smol = dataclasses.replace(cfg, num_attention_heads=9, num_key_value_heads=3)  # handled
    assert [ShardPlan(smol, 2, r).kv_heads for r in (0, 1)] == [(0, 1), (1, 3)]
    with pytest.raises(ValueError, match="tensor_parallel_size must be an int >= 1"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="enable_kv_cache=False"):
        EngineConfig(tensor_parallel_size=2, enable_kv_cache=False)


# ---------------------------------------------------------------------- the step (Day 65)

def test_a_message_round_trips_and_a_long_one_takes_a_tail():
    m = protocol.Message(protocol.PREFILL, [3, 0], [[5, 6, 7], list(range(2000))],
                         frozenset({0}), [mirror.EXTEND, 3, 2, 9, 10])
    ints = protocol.encode(m)
    assert len(ints) > protocol.HEADER  # this one needs the second broadcast
    assert protocol.decode(ints) == m


def test_replaying_the_journal_reproduces_rank_zeros_addressing():
    shape = (1, 1, 4, 32, 4, 4, 64)
    ours, theirs = mirror.MirroredCache(*shape), BatchedPagedKVCache(*shape)
    ours.tables[0].extend([3, 4])
    ours.tables[2].extend([7])
    ours.adopt_prefix(0, 6)
    ours.tables[2].extend([8, 9])
    ours.move_row(2, 1)
    ours.reset_row(0)
    ours.tables[0].extend([1])
    assert mirror.replay(theirs, ours.take_journal()) == 7
    assert ours.journal == []
    assert [t.blocks for t in ours.tables] == [t.blocks for t in theirs.tables]
    assert ours.lengths == theirs.lengths
    assert torch.equal(ours.slots.cells, theirs.slots.cells)
    ours.tables[1].extend([11])  # the moved table still journals under its new row
    mirror.replay(theirs, ours.take_journal())
    assert theirs.tables[1].blocks == [7, 8, 9, 11]
    ours.drop_blocks(1, [0, 1], 0)  # left a sliding window: the entries name the null block
    assert mirror.replay(theirs, ours.take_journal()) == 1
    assert theirs.tables[1].blocks == [0, 0, 9, 11]
    assert torch.equal(ours.slots.cells, theirs.slots.cells)
    with pytest.raises(RuntimeError, match="journal record 9"):
        mirror.replay(theirs, [9, 0])


SLOW = pytest.mark.slow  # the long matrix: make test keeps one case of each kind


@pytest.mark.parametrize("options", [
    {},
    pytest.param({"num_kv_blocks": 6, "max_num_seqs": 4}, marks=SLOW),  # preempts, recomputes
    pytest.param({"cuda_graphs": True}, marks=SLOW),  # windows replayed eagerly, rows compacted
    {"enable_prefix_caching": True, "max_num_batched_tokens": 16},  # chunks, cache hits
    pytest.param({"batching": "static", "allocation": "reserve", "kernels": False}, marks=SLOW),
], ids=["default", "preemption", "graphs", "prefix-chunked", "static-plain"])
def test_two_ranks_say_what_one_says(options):
    prompts = PROMPTS
    if options.get("enable_prefix_caching"):
        prompts = ["You are a helpful assistant who answers briefly. " * 2 + p for p in PROMPTS]
    one, two, stats, engine = pair(prompts=prompts, **options)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert [o.text for o in two] == [o.text for o in one]
    if "num_kv_blocks" in options:
        assert stats.preemptions > 0
    if options.get("cuda_graphs"):
        assert stats.replay_share > 0
    if options.get("enable_prefix_caching"):
        assert stats.prefix_cache_hits > 0


@pytest.mark.slow
def test_compile_traces_the_collectives_as_opaque_ops():
    one, two, _, engine = pair(prompts=PROMPTS[:4], compile="aot_eager")
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert engine.compiled.compiles > 0


@pytest.mark.parametrize("name, overrides", [
    ("bias", {"vocab_size": 255, "eos_token_id": 254}),  # biases, a padded vocabulary
    ("gqa", {"num_key_value_heads": 1}),  # one KV head: replicated on both ranks
    pytest.param("gqa", {"num_attention_heads": 6, "num_key_value_heads": 3,
                         "hidden_size": 48}, marks=SLOW),  # 1 + 2
])
def test_logits_differ_by_rounding_only(hf_checkpoint, name, overrides):
    path = hf_checkpoint(name, **overrides)
    ids = list(range(3, 40))
    ref = greedy_logits(LLM(path, dtype="float32", skip_tokenizer_init=True), ids, 8)
    with LLM(path, dtype="float32", skip_tokenizer_init=True, tensor_parallel_size=2) as llm:
        got = greedy_logits(llm, ids, 8)
    assert len(got) == len(ref) and got[0].shape == (overrides.get("vocab_size", 256),)
    diff = max((a - b).abs().max().item() for a, b in zip(got, ref, strict=True))
    assert diff < LOGIT_BOUND, diff
    assert [int(a.argmax()) for a in got] == [int(b.argmax()) for b in ref]


# ---------------------------------------------------------------------- failure and shutdown

def test_a_killed_worker_fails_the_engine_at_once_and_says_so():
    llm = LLM(dtype="float32", tensor_parallel_size=2, distributed_timeout_s=10)
    try:
        (worker,) = llm.engine.executor.processes
        worker.kill()
        worker.join(5)
        t0 = time.monotonic()
        with pytest.raises(EngineBroken, match=r"rank 1 \(pid \d+\) exited with code -9"):
            llm.generate(PROMPTS[:2], GREEDY)
        assert time.monotonic() - t0 < 10
    finally:
        llm.shutdown()
    assert not alive_workers()


def test_a_hung_worker_fails_the_engine_within_the_timeout():
    llm = LLM(dtype="float32", tensor_parallel_size=2, distributed_timeout_s=3)
    (worker,) = llm.engine.executor.processes
    try:
        os.kill(worker.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(EngineBroken, match="distributed_timeout_s=3"):
            llm.generate(PROMPTS[:2], GREEDY)
        assert time.monotonic() - t0 < 3 + 10
    finally:
        llm.shutdown()  # SIGKILL reaches a stopped process too
    assert not alive_workers()


@pytest.mark.slow
def test_two_engines_side_by_side_each_on_its_own_group():
    one = LLM(dtype="float32").generate(PROMPTS[:3], GREEDY)
    with LLM(dtype="float32", tensor_parallel_size=2) as a, \
            LLM(dtype="float32", tensor_parallel_size=2) as b:
        assert a.engine.executor.comm.port != b.engine.executor.comm.port
        assert len(alive_workers()) == 2
        for llm in (a, b, a):
            assert [o.token_ids for o in llm.generate(PROMPTS[:3], GREEDY)] == \
                [o.token_ids for o in one]
    assert not alive_workers()


# ---------------------------------------------------------------------- serving

def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].startswith("Z")  # a zombie is gone but unreaped
    except FileNotFoundError:
        return True


def gauge(url: str, name: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


def test_the_server_with_tp_2_answers_as_one_rank_does():
    import openai

    from nanoserve.bench.local_server import local_server
    from tests.server_fixture import wait_for

    one = LLM(dtype="float32").generate(PROMPTS[:4], SamplingParams(max_tokens=16,
                                                                    temperature=0))
    with local_server(DEFAULT_MODEL, dtype="float32", max_num_seqs=4,
                      extra_args=("-tp", "2")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0,
                               timeout=60)
        model = client.models.list().data[0].id
        texts = [client.completions.create(model=model, prompt=p, max_tokens=16,
                                           temperature=0).choices[0].text for p in PROMPTS[:4]]
        assert texts == [o.text for o in one]
        stream = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=400,
                                           temperature=0, stream=True)
        next(iter(stream))
        stream.close()  # a hang-up aborts the request; its blocks go back
        wait_for(lambda: gauge(srv.url, "nanoserve:num_requests_running") == 0
                 and gauge(srv.url, "nanoserve:kv_cache_usage_perc") == 0, 30,
                 what="the aborted stream to leave the batch and give its blocks back")
        assert gauge(srv.url, "nanoserve:generation_tokens_total") >= 4 * 16
        workers = _children(srv.pid)
        assert workers, "the server started no worker process"
    # the server stops its worker (STOP, then a kill); an orphan dies with its parent anyway
    wait_for(lambda: all(_gone(w) for w in workers), 15, interval=0.05,
             what="the server's worker processes to exit")


def test_two_torchrun_nodes_on_one_machine_serve_what_one_rank_says(tmp_path):
    import httpx

    from nanoserve.bench.local_server import free_port
    from tests.server_fixture import wait_for

    one = LLM(dtype="float32").generate(PROMPTS[0], SamplingParams(max_tokens=16,
                                                                   temperature=0))[0].text
    master, http = free_port(), free_port()
    procs = []
    try:
        for node in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr",
                   "127.0.0.1", "--master-port", str(master), "-m", "nanoserve.cli", "serve",
                   "--host", "127.0.0.1", "--port", str(http), "--dtype", "float32", "-tp", "2",
                   "--distributed-executor-backend", "external_launcher"]
            log = open(tmp_path / f"node{node}.log", "w")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        url = f"http://127.0.0.1:{http}"

        def healthy():
            assert all(p.poll() is None for p in procs), [
                (tmp_path / f"node{n}.log").read_text()[-2000:] for n in (0, 1)]
            try:
                return httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 120, interval=0.2, what="node 0's server")
        r = httpx.post(url + "/v1/completions", timeout=60, trust_env=False,
                       json={"model": "nanoserve-tiny", "prompt": PROMPTS[0], "max_tokens": 16,
                             "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == one
        (server,) = _children(procs[0].pid)  # node 0's rank, under its torchrun agent
        os.kill(server, signal.SIGTERM)  # rank 0 drains and stops; rank 1 follows
        assert [p.wait(60) for p in procs] == [0, 0], [
            (tmp_path / f"node{n}.log").read_text()[-2000:] for n in (0, 1)]
        assert "rank 0 stopped after" in (tmp_path / "node1.log").read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

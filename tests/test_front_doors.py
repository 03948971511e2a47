"""Every front door honours the engine's policies, or refuses them by name.

Static waves (Day 29) and the uncached path (Day 4) are policies of the one engine core, so
``LLM``, ``AsyncLLM`` and ``nanoserve serve`` all run them; an option one policy cannot honour
beside another is a ``ConfigError`` naming it; the server logs what was set away from the
defaults. Servers listen on 127.0.0.1 on a free port, and every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading

import httpx
import pytest
from server_fixture import ServerThread, wait_for

from nanoserve import LLM, SamplingParams
from nanoserve.bench.local_server import free_port, wait_healthy
from nanoserve.config import ConfigError, EngineConfig
from nanoserve.entrypoints.openai import serve
from nanoserve.entrypoints.openai.app import build_app
from nanoserve.loader import load_core

GREEDY = dict(temperature=0, ignore_eos=True)


def trace(core, lens: dict[str, int]) -> dict[str, list[int]]:
    """Add one request per entry (``max_tokens`` its value), step to the end; the iterations
    (1-based) at which each request got tokens."""
    for i, (rid, n) in enumerate(lens.items()):
        core.add_request(rid, [0, 5 + i, 9], SamplingParams(max_tokens=n, **GREEDY))
    got: dict[str, list[int]] = {rid: [] for rid in lens}
    step = 0
    while core.has_unfinished():
        step += 1
        for d in core.step():
            if d.new_token_ids:
                got[d.request_id].append(step)
    core.check_drained()
    return got


def test_a_static_wave_holds_its_finished_members_until_its_last_one_is_done():
    kw = dict(dtype="float32", max_num_seqs=2, block_size=4, skip_tokenizer_init=True)
    lens = {"a": 2, "b": 6, "c": 2}  # a and b are the first wave; c waits for both
    static, continuous = load_core(EngineConfig(batching="static", **kw)), \
        load_core(EngineConfig(**kw))
    waves, flowing = trace(static, lens), trace(continuous, lens)
    assert waves == {"a": [1, 2], "b": [1, 2, 3, 4, 5, 6], "c": [7, 8]}
    assert flowing["c"][0] == 3  # continuous: c takes a's row as soon as a is done
    s = static.snapshot()
    assert s.row_steps == 2 * 6 + 2  # a's row computed through the wave's last step, held
    assert s.forward_passes == 6 + 2 and s.iterations == 8


def test_asyncllm_and_the_servers_flags_serve_static_waves():
    """The config ``nanoserve serve --batching static`` builds, served: a request that arrives
    while a wave runs waits, for step after step, until the wave ends; its text is the offline
    static engine's."""
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    args = p.parse_args(["--dtype", "float32", "--batching", "static", "--max-num-seqs", "2"])
    config = EngineConfig.from_cli_args(args).for_serving()
    assert config.batching == "static" and config.non_default() == {
        "dtype": "float32", "max_num_seqs": 2, "batching": "static"}
    engine = serve.build_engine(config)
    # the wave must outlast the short request's trip to the server on any machine: a long
    # reply (most of the 1,024-token context) keeps it running for hundreds of steps
    long, short = ("The for statement", 900), ("The while statement", 8)
    with ServerThread(build_app(engine, "tiny")) as s:
        body = {"model": "tiny", "prompt": long[0], "max_tokens": long[1], "stream": True,
                **GREEDY}
        answers: dict[str, str] = {}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # the wave is running
            started = engine.iterations

            def send_short():
                b = {"model": "tiny", "prompt": short[0], "max_tokens": short[1], **GREEDY}
                answers["short"] = httpx.post(s.url + "/v1/completions", json=b,
                                              timeout=120).json()["choices"][0]["text"]

            t = threading.Thread(target=send_short)
            t.start()
            snaps = wait_for(lambda: (snap := engine.snapshot()).num_waiting == 1
                             and snap.num_running == 1 and engine.iterations >= started + 3,
                             timeout=60, what="the short request waiting out the wave")
            assert snaps
            for _ in lines:  # drain the long stream to its end
                pass
        t.join(timeout=120)
        assert not t.is_alive()
    snap = engine.snapshot()
    assert snap.num_free_blocks == snap.num_blocks
    want = LLM(dtype="float32", batching="static").generate(
        [short[0]], SamplingParams(max_tokens=short[1], **GREEDY))[0].text
    assert answers["short"] == want


def _serve(flags: list[str]) -> tuple[int, str, str]:
    """``nanoserve serve`` with ``flags`` as a child process: one greedy completion, then
    SIGTERM. Returns (exit code, the completion's text, the log)."""
    port = free_port()
    cmd = [sys.executable, "-m", "nanoserve.cli", "serve", "--host", "127.0.0.1", "--port",
           str(port), "--dtype", "float32", "--max-num-seqs", "2", *flags]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})

        def read() -> str:
            log.flush()
            log.seek(0)
            return log.read()

        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(proc, url, 180, lambda: read()[-2000:], "nanoserve serve", 0.25)
            r = httpx.post(url + "/v1/completions", timeout=120, json={
                "model": "nanoserve-tiny", "prompt": "The if statement", "max_tokens": 12,
                **GREEDY})
            assert r.status_code == 200, r.text
            text = r.json()["choices"][0]["text"]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(timeout=15)
        return code, text, read()


@pytest.mark.parametrize("flags,option,kw", [
    (["--batching", "static"], "batching=static", dict(batching="static")),
    (["--no-kv-cache"], "enable_kv_cache=False", dict(enable_kv_cache=False)),
])
def test_nanoserve_serve_honours_the_policy_and_logs_it(flags, option, kw):
    code, text, log = _serve(flags)
    assert code == 0, log[-2000:]  # drained: every block back
    line = next(ln for ln in log.splitlines() if "non-default args:" in ln)
    assert option in line and "dtype=float32" in line
    want = LLM(dtype="float32", **kw).generate(["The if statement"],
                                               SamplingParams(max_tokens=12, **GREEDY))
    assert text == want[0].text


@pytest.mark.parametrize("options,field", [
    (dict(batching="static", allocation="incremental"), "allocation"),
    (dict(batching="static", max_num_batched_tokens=64), "max_num_batched_tokens"),
    (dict(enable_kv_cache=False, enable_prefix_caching=True), "enable_prefix_caching"),
    (dict(enable_kv_cache=False, cuda_graphs=True), "cuda_graphs"),
    (dict(enable_kv_cache=False, compile=True), "compile"),
    (dict(enable_kv_cache=False, batching="static"), "batching"),
])
def test_an_option_a_policy_cannot_honour_is_refused_by_name(options, field):
    with pytest.raises(ConfigError, match=field) as e:
        EngineConfig(**options)
    assert e.value.field == field


def test_static_waves_reserve_and_take_no_step_budget():
    c = EngineConfig(batching="static")
    assert (c.allocation_policy, EngineConfig().allocation_policy) == ("reserve", "incremental")
    assert c.for_serving() is c  # no serving budget for a wave: its prompts are one prefill


def test_rows_granted_by_hand_and_scheduled_rows_never_meet():
    """A core's engine grants rows by hand from the scheduler's own pool, between steps: a
    scheduled row is refused, and a step is refused while hand-granted rows are held."""
    llm = LLM(dtype="float32", max_num_seqs=2, block_size=4, skip_tokenizer_init=True)
    e, core = llm.engine, llm.core
    kv = core.scheduler.kv_cache_manager
    core.add_request("r", [0, 5, 9], SamplingParams(max_tokens=4, **GREEDY))
    core.step()  # r holds row 0
    with pytest.raises(RuntimeError, match="scheduled request"):
        e.grant(0, 8)
    e.grant(1, 8)  # a free row: its blocks come from the scheduler's pool
    assert kv.num_held == 1 + 2 and e.hand_rows == {1}  # r's block, and row 1's two
    with pytest.raises(RuntimeError, match="granted by hand"):
        core.step()
    e.release(1)
    while core.has_unfinished():
        core.step()
    core.check_drained()

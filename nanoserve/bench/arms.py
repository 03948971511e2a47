"""graphbench's arms over sockets: one server per arm, the same seeded load at every rate.

Why this module exists: whether recorded windows make decoding faster is a question about a
server under load, so each arm is a ``nanoserve serve`` with its own flags, driven over HTTP by
the serving benchmark's seeded load (``serve.run_bench``), one rate after another:

- ``graphs``: ``--cuda-graphs --compile``; ``eager``: ``--compile``; ``no-compile``: neither.
  All three keep the persistent batch (``--persistent-batch``), so the gap between the first
  two has one cause, and the third separates what compile already saved from what graphs add;
- ``free-rows`` is the control: windows with the persistent batch off (``compact_rows=False``),
  so the replay gate has a run it must fail;
- ITL p50 and p99 are reported apart: a replay shortens the typical gap, while warm-up and
  stragglers live in the tail;
- each arm's ``/metrics`` gives its replayed and scattered decode steps, and an arm with
  windows is held to ``check_arm_replayed_every_step``.

A server is a child process by default (``local_server``), so the load generator never shares
an interpreter with the engine it measures; that is how a card runs it. ``in_process=True``
serves each arm from a thread of this process instead: the same engine, built by
``serve.build_engine`` from the flags parsed as ``nanoserve serve`` parses them, the same app
and uvicorn server, the requests still over HTTP on 127.0.0.1. What that buys is the engine
itself within reach once the load is done, so each row also carries the scheduler's own
counters (the compactor's calls, compactions and row moves, and preemptions), which
``/metrics`` does not show. Without CUDA the graphed arms run the eager-replay windows (same
buffers, no capture), and the report says so; their times then say nothing about graphs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading
import time
from pathlib import Path

from nanoserve.bench.gates import GateFailed, check_arm_replayed_every_step

# arm -> its ``nanoserve serve`` flags; "free-rows" is the control: graphs without compaction
ARMS = {
    "graphs": ("--cuda-graphs", "--compile", "--persistent-batch"),
    "eager": ("--compile", "--persistent-batch"),
    "no-compile": ("--no-compile", "--persistent-batch"),
    "graphs-no-compile": ("--cuda-graphs", "--no-compile", "--persistent-batch"),
    "free-rows": ("--cuda-graphs", "--no-compile", "--no-persistent-batch"),
}
DEFAULT_ARMS = ("graphs", "eager", "no-compile")
ARM_COLUMNS = ("arm", "rate", "itl p50 ms", "itl p99 ms", "ttft p50 ms", "tok/s",
               "decode steps", "replayed", "scattered", "share")
ENGINE_COLUMNS = ("compactions", "moves", "preemptions")  # rows served in-process only


def replay_counters(metrics_text: str) -> dict:
    """The two Day-57 counters from a ``/metrics`` page (summed over label sets)."""
    import re

    out = {}
    for key in ("replayed", "scattered"):
        pat = rf"^nanoserve:decode_steps_{key}_total(?:{{[^}}]*}})? ([0-9.e+]+)$"
        out[key] = int(sum(float(m) for m in re.findall(pat, metrics_text, re.M)))
    out["decode_steps"] = out["replayed"] + out["scattered"]
    return out


def engine_counters(engine) -> dict:
    """What the engine itself counted (an ``AsyncLLM``): its scheduler's compactor and its
    preemptions, read off the objects, never worked out."""
    c = engine.core.scheduler.compactor
    return {"compact_rows": c.mode == "persistent", "compactor_calls": c.calls,
            "compactions": c.compactions, "moves": c.moves,
            "preemptions": engine.snapshot().num_preemptions}


@contextlib.contextmanager
def served_here(model: Path, flags: tuple[str, ...], timeout_s: float = 180.0):
    """``nanoserve serve --model model *flags`` on a thread of this process, on a free port of
    127.0.0.1; yields ``(LocalServer, engine)`` once ``/health`` says 200, stops it after."""
    import httpx

    from nanoserve.bench.local_server import LocalServer
    from nanoserve.config import EngineConfig
    from nanoserve.entrypoints.openai import serve
    from nanoserve.entrypoints.openai.app import build_app

    ap = argparse.ArgumentParser()
    serve.add_arguments(ap)
    args = ap.parse_args(["--model", str(model), "--log-level", "warning", *flags])
    config = EngineConfig.from_cli_args(args).for_serving()
    engine = serve.build_engine(config, max_waiting=args.max_waiting)
    app = build_app(engine, args.served_model_name or config.model.resolve().name,
                    max_body_bytes=args.max_body_bytes)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # a free port, held from here on
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = serve.make_server(app, engine, "127.0.0.1", sock.getsockname()[1],
                               args.drain_timeout, "warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="nanoserve-arm", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if not thread.is_alive():
                raise RuntimeError("the in-process server stopped before it was healthy")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2.0, trust_env=False).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the in-process server was not healthy within {timeout_s}s")
            time.sleep(0.1)
        yield LocalServer(url, os.getpid()), engine
    finally:
        server.should_exit = True  # uvicorn stops; the app's lifespan shuts the engine down
        thread.join(timeout=60)
        sock.close()


def run_arms(weights: str, device: str, rates: list[float], arms=DEFAULT_ARMS,
             requests: int = 64, input_len: int = 64, output_len: int = 64,
             max_num_seqs: int = 8, max_model_len: int | None = 1024, dtype: str | None = None,
             seed: int = 0, server_timeout_s: float = 600.0, on_arm=None,
             serve_flags: tuple[str, ...] = (), deadline: float | None = None,
             in_process: bool = False) -> dict:
    """One server per arm on ``weights``, the same seeded load at every rate; returns the
    report (hardware, model, workload, batch size, one row per arm and rate, the gate).

    ``on_arm(report)``, if given, is called after each arm with the report so far (the
    gpu-check script writes its results file there, so a later failure keeps the earlier
    arms). ``serve_flags`` go to every arm's server (``--skip-tokenizer-init`` for weights
    without a tokenizer). Past ``deadline`` (a ``time.perf_counter()`` reading) no arm is
    started, each one left out is named in ``report["skipped"]``, and a rate in flight gives up
    at the deadline (its unfinished requests count as failed). ``in_process``: serve each arm
    from a thread here and add the engine's own counters to its rows (module docstring)."""
    import httpx

    from nanoserve.bench.local_server import engine_argv, local_server
    from nanoserve.bench.serve import run_bench

    folder = Path(weights)
    if not (folder / "config.json").is_file():
        raise ValueError(f"--weights {weights}: no checkpoint folder (config.json) there")
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"arms {list(arms)}: choose from {sorted(ARMS)}")
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"rates must be positive, got {rates}")
    import torch

    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ValueError(f"--device {device} but CUDA is not available here")
    from nanoserve.bench.hardware import describe_hardware, hardware

    hw = hardware(device)
    report = {
        "hardware": describe_hardware(hw), "machine": hw, "device": device,
        "windows": "cuda graphs" if cuda else "eager replay (no CUDA: the graphed arm's "
                                               "windows run eagerly; its times say nothing "
                                               "about graphs)",
        "model": folder.resolve().name, "dtype": dtype or "auto",
        "workload": {"requests": requests, "input_len": input_len, "output_len": output_len,
                     "rates": rates, "seed": seed, "arrivals": "poisson"},
        "batch_size": max_num_seqs, "max_model_len": max_model_len, "rows": [], "gates": {},
        "skipped": {}, "servers": "in this process" if in_process else "child processes"}
    for arm in arms:
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left < 30:
            report["skipped"][arm] = f"not started: {max(left, 0):.0f} s of the budget left"
            continue
        flags = ARMS[arm] + (("--max-model-len", str(max_model_len)) if max_model_len else ())
        flags += tuple(serve_flags)
        t0 = time.perf_counter()
        if in_process:
            engine_flags = engine_argv({k: v for k, v in (("dtype", dtype), ("device", device),
                                                          ("max_num_seqs", max_num_seqs))
                                        if v is not None})
            served = served_here(folder, (*engine_flags, *flags), server_timeout_s)
        else:
            served = local_server(folder, dtype=dtype, device=device, max_num_seqs=max_num_seqs,
                                  timeout_s=server_timeout_s, extra_args=flags)
        with served as srv:
            srv, engine = srv if in_process else (srv, None)
            results = run_bench(url=srv.url, rates=rates, requests=requests,
                                input_len=input_len, output_len=output_len, seed=seed,
                                model=folder, max_duration_s=min(
                                    server_timeout_s,
                                    left if left is not None else server_timeout_s))
            counts = replay_counters(httpx.get(srv.url + "/metrics", timeout=30,
                                               trust_env=False).text)
            if engine is not None:
                counts |= engine_counters(engine)
        for r in results:
            report["rows"].append({
                "arm": arm, "flags": " ".join(flags), "rate": r["rate"],
                "itl_p50_ms": r["median_itl_ms"], "itl_p99_ms": r["p99_itl_ms"],
                "ttft_p50_ms": r["median_ttft_ms"], "output_throughput": r["output_throughput"],
                "completed": r["completed"], "failed": r["failed"],
                "output_tokens": r["total_output_tokens"], **counts,
                "share": counts["replayed"] / counts["decode_steps"] if counts["decode_steps"]
                else 0.0})
        if "--cuda-graphs" in flags:
            try:
                verdict = "PASS " + check_arm_replayed_every_step(
                    counts["decode_steps"], counts["replayed"], arm)
            except GateFailed as e:
                verdict = f"FAIL {e}"
            report["gates"][arm] = verdict
        report.setdefault("arm_seconds", {})[arm] = round(time.perf_counter() - t0, 1)
        if on_arm is not None:
            on_arm(report)
    return report


def render_arms(report: dict) -> str:
    """The arms as a table, with what they ran on, and the gate verdicts under it."""
    rows = [{"arm": r["arm"], "rate": r["rate"], "itl p50 ms": f"{r['itl_p50_ms']:.2f}",
             "itl p99 ms": f"{r['itl_p99_ms']:.2f}", "ttft p50 ms": f"{r['ttft_p50_ms']:.1f}",
             "tok/s": f"{r['output_throughput']:.0f}", "decode steps": r["decode_steps"],
             "replayed": r["replayed"], "scattered": r["scattered"],
             "share": f"{r['share']:.0%}", **{c: r.get(c, "-") for c in ENGINE_COLUMNS}}
            for r in report["rows"]]
    columns = ARM_COLUMNS + (ENGINE_COLUMNS if any("compactions" in r for r in report["rows"])
                             else ())
    w = report["workload"]
    head = (f"graphbench arms on {report['hardware']}; windows: {report['windows']}\n"
            f"model {report['model']} ({report['dtype']}), batch size {report['batch_size']}, "
            f"{w['requests']} requests of {w['input_len']} in/{w['output_len']} out per rate "
            f"(decode counters are per arm, over all its rates)")
    widths = [max([len(c), *(len(str(r[c])) for r in rows)]) for c in columns]  # rows may be none
    lines = [head, " ".join(c.rjust(wd) for c, wd in zip(columns, widths, strict=True))]
    lines += [" ".join(str(r[c]).rjust(wd) for c, wd in zip(columns, widths, strict=True))
              for r in rows]
    lines += [v for v in report["gates"].values()]
    lines += [f"SKIPPED {arm}: {why}" for arm, why in report.get("skipped", {}).items()]
    return "\n".join(lines)

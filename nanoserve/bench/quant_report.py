"""``nanoserve bench quant``'s figures: each arm's best round, the byte ceiling and the ratios, the
8-row rows, and the table.

Why this module exists: the ratios the issue sets as targets must be computed one way and
printed beside what they came from. Per decode row (an arm at a thread count): decode tokens/s
(the best round), prompt time, bytes a step reads; per quantized row the byte ceiling (bf16's
bytes over its bytes: the speed-up a memory-bound step could get), the speed-up it got over the
same engine's bf16 row at the same threads, and that as a fraction of the ceiling; per
nanoserve row its ratio over llama.cpp at equal bytes (BF16, Q8_0, Q4_0), and how many leading
greedy tokens the two share. The 8-row section (``offline_section``) times ``bench offline``'s
workload (decode) and its prompts with one new token (prefill) per checkpoint and engine.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

PAIR = {"bf16": "BF16", "w8a16": "Q8_0", "w4a16": "Q4_0"}


def summarize(report: dict) -> None:
    """Best rounds, ceilings, fractions and ratios into the rows (in place)."""
    from nanoserve.bench.quant_arms import first_divergence

    sb = report["step_bytes"]
    rows = report["rows"]
    by = {(r["engine"], r["weights"], r["threads"]): r for r in rows}
    for r in rows:
        r["bytes_per_step"] = sb[r["weights"]]["total"]
        if r["status"] != "ok" or not r["rounds"]:
            r["decode_tokens_per_s"] = None
            continue
        best = max(r["rounds"], key=lambda x: x["decode_tokens_per_s"])
        r["decode_tokens_per_s"] = round(best["decode_tokens_per_s"], 2)
        r["decode_tokens_per_s_rounds"] = [round(x["decode_tokens_per_s"], 2)
                                           for x in r["rounds"]]
        r["prompt_ms"] = round(1000 * min(x["prompt_s"] for x in r["rounds"]), 2)
    for r in rows:
        if r["weights"] != "bf16":
            r["byte_ceiling"] = round(sb["bf16"]["total"] / sb[r["weights"]]["total"], 3)
            base = by.get((r["engine"], "bf16", r["threads"]))
            if r["decode_tokens_per_s"] and base and base["decode_tokens_per_s"]:
                r["speedup_over_bf16"] = round(r["decode_tokens_per_s"]
                                               / base["decode_tokens_per_s"], 3)
                r["fraction_of_ceiling"] = round(r["speedup_over_bf16"] / r["byte_ceiling"], 3)
        if r["engine"] == "nanoserve":
            peer = by.get(("llamacpp", r["weights"], r["threads"]))
            if peer and r["decode_tokens_per_s"] and peer["decode_tokens_per_s"]:
                r["ratio_over_llamacpp"] = round(r["decode_tokens_per_s"]
                                                 / peer["decode_tokens_per_s"], 3)
            if peer and r.get("tokens") and peer.get("tokens"):
                r["greedy_tokens_shared_with_llamacpp"] = first_divergence(r["tokens"],
                                                                           peer["tokens"])


def offline_section(folders: dict, threads: int, rounds: int, vllm: bool, vllm_venv: Path,
                    log) -> dict:
    """``bench offline``'s workload (16 requests, 8 rows at a time) for decode, and its first 8
    prompts with one new token each for prefill, on the bf16, W4A16 and W8A8 folders; nanoserve
    (``threads`` torch threads) and, with ``vllm``, vLLM's CPU build. Per checkpoint the engines
    load once and take turns for ``rounds`` rounds; a figure is the median round."""
    from nanoserve.bench.adapters import Setup, Skipped
    from nanoserve.bench.offline import workload_for
    from nanoserve.bench.runner import make_engine

    torch.set_num_threads(threads)
    rows = []
    for name in ("bf16", "w4a16", "w8a8"):
        wl, max_len = workload_for(folders[name])
        prefill = wl.head(8, max_tokens=1)
        prompt_tokens = sum(len(p) for p in prefill.prompts)
        setup = Setup(Path(folders[name]), "bfloat16", "cpu", 8, max_len, {}, vllm_venv, {})
        live, got = {}, {}
        for engine in ("nanoserve", "vllm") if vllm else ("nanoserve",):
            row = got[engine] = {"weights": name, "engine": engine, "status": "ok",
                                 "decode_s": [], "prefill_s": []}
            log(f"8 rows, {name}: loading {engine}")
            try:
                e = make_engine(engine, setup, wl)
                e.run(wl.head(8, max_tokens=8))  # warm-up
                live[engine] = e
                row.update(version=e.version, threads=e.threads)
            except Skipped as err:
                row.update(status="skipped", reason=str(err))
            except Exception as err:
                row.update(status="error", reason=f"{type(err).__name__}: {err}"[:800])
        order = list(live)
        for r in range(rounds):
            for engine in order[r % len(order):] + order[:r % len(order)] if order else []:
                log(f"8 rows, {name}, round {r + 1}/{rounds}: {engine}")
                try:
                    for key, w in (("decode_s", wl), ("prefill_s", prefill)):
                        t0 = time.perf_counter()
                        live[engine].run(w)
                        wall = time.perf_counter() - t0
                        got[engine][key].append(getattr(live[engine], "last_wall_s", None)
                                                or wall)
                except Exception as err:
                    got[engine].update(status="error", reason=f"round {r + 1}: "
                                       f"{type(err).__name__}: {err}"[:800])
                    live.pop(engine).close()
                    order.remove(engine)
                    break
        for e in live.values():
            e.close()
        for row in got.values():
            if row["status"] == "ok" and row["decode_s"]:
                row["decode_tokens_per_s"] = round(wl.useful_tokens
                                                   / statistics.median(row["decode_s"]), 2)
                row["prefill_tokens_per_s"] = round(prompt_tokens
                                                    / statistics.median(row["prefill_s"]), 2)
            rows.append(row)
    base = {r["engine"]: r for r in rows if r["weights"] == "bf16" and r["status"] == "ok"}
    for r in rows:
        b = base.get(r["engine"])
        if r["weights"] != "bf16" and b and r.get("decode_tokens_per_s"):
            r["decode_over_bf16"] = round(r["decode_tokens_per_s"] / b["decode_tokens_per_s"], 3)
            r["prefill_over_bf16"] = round(r["prefill_tokens_per_s"]
                                           / b["prefill_tokens_per_s"], 3)
    return {"threads": threads, "workload": {"decode": "16 requests, prompts 16-192, outputs "
                                             "16-128, seed 0, 8 rows at a time",
                                             "prefill": f"its first 8 prompts ({prompt_tokens} "
                                             f"tokens), 1 new token each, one batch"},
            "figure": "median round", "rows": rows, "pid": os.getpid()}


def print_report(report: dict) -> None:
    """The decode table, then the 8-row one, with the machine and the workload, on stderr."""
    from rich.console import Console

    console = Console(stderr=True, width=150)
    if report["rows"]:
        _decode_table(console, report)
    off = report.get("offline")
    if off:
        _offline_table(console, off)


def _decode_table(console, report: dict) -> None:
    from rich.table import Table

    from nanoserve.bench.hardware import describe_hardware

    w = report["workload"]
    t = Table(title=f"nanoserve bench quant: {report['shape']}, random weights, bf16 "
                    f"activations, one request, {w['prompt_len']} prompt tokens, "
                    f"{w['new_tokens']} new, greedy",
              caption=f"Hardware: {describe_hardware(report['hardware'])}. Decode tok/s: "
                      f"{w['new_tokens'] - 1} steps after the first token, best of "
                      f"{w['rounds']} interleaved rounds (each listed). Ceiling: bf16's bytes "
                      f"per step over the row's.", caption_justify="left")
    for col in ("arm", "threads", "MB/step", "decode tok/s", "rounds", "prompt ms",
                "x bf16", "ceiling", "of ceiling", "/ llama.cpp", "same greedy"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    notes = []
    for r in report["rows"]:
        if r["status"] != "ok":
            t.add_row(r["arm"], str(r["threads"]), f"{r['bytes_per_step'] / 1e6:.1f}",
                      r["status"], *[""] * 7)
            notes.append(f"{r['arm']} ({r['threads']} thr): {r.get('reason')}")
            continue
        f = lambda k, fmt, r=r: "" if r.get(k) is None else fmt.format(r[k])  # noqa: E731
        t.add_row(r["arm"], str(r["threads"]), f"{r['bytes_per_step'] / 1e6:.1f}",
                  f("decode_tokens_per_s", "{:.1f}"),
                  " ".join(f"{x:.0f}" for x in r["decode_tokens_per_s_rounds"]),
                  f("prompt_ms", "{:.1f}"), f("speedup_over_bf16", "{:.2f}x"),
                  f("byte_ceiling", "{:.2f}x"), f("fraction_of_ceiling", "{:.0%}"),
                  f("ratio_over_llamacpp", "{:.2f}x"),
                  "" if r.get("greedy_tokens_shared_with_llamacpp") is None
                  else f"{r['greedy_tokens_shared_with_llamacpp']}/{w['new_tokens']}")
    console.print(t)
    for line in notes:
        console.print(f"  {line}", highlight=False, markup=False)


def _offline_table(console, off: dict) -> None:
    from rich.table import Table

    t = Table(title=f"8 rows ({off['workload']['decode']}); prefill: "
                    f"{off['workload']['prefill']}; median of rounds", caption_justify="left")
    for col in ("weights", "engine", "threads", "decode tok/s", "x bf16", "prefill tok/s",
                "x bf16 "):
        t.add_column(col, justify="left" if col in ("weights", "engine", "threads") else "right")
    for r in off["rows"]:
        if r["status"] != "ok":
            t.add_row(r["weights"], r["engine"], "", r["status"], "", "", "")
            console.print(f"  {r['weights']} {r['engine']}: {r.get('reason')}",
                          highlight=False, markup=False)
            continue
        t.add_row(r["weights"], r["engine"], str(r.get("threads", "")),
                  f"{r['decode_tokens_per_s']:.1f}", f"{r.get('decode_over_bf16', 1):.2f}x",
                  f"{r['prefill_tokens_per_s']:.1f}", f"{r.get('prefill_over_bf16', 1):.2f}x")
    console.print(t)

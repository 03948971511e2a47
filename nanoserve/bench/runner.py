"""The offline bench's run: every engine loaded, warmed up, then timed in rotating rounds.

Why this module exists: on a shared machine the load drifts while a benchmark runs, and a peer
timed after nanoserve meets a different machine than nanoserve met. So every engine loads once
and runs one untimed warm-up first; then the engines take turns for ``rounds`` rounds, the
order rotating each round, so that drift falls on each engine alike. A round's figure is useful
tokens per second (the tokens the requests asked for over the wall time of the whole workload);
an engine's is the median over rounds, and its ratio is nanoserve's over it. Every row also
counts the requests whose tokens are exactly nanoserve's: in float32 that checks the harness.

A peer that cannot run is a row that says so ("skipped" or "error", with the reason), never a
number. nanoserve refusing its own options is the caller's mistake, not a row: that ValueError
goes to the caller (the command prints it and exits 2).
"""

from __future__ import annotations

import statistics
import time

import torch

from nanoserve.bench.adapters import (
    ENGINES,
    HFContinuousEngine,
    HFGenerateEngine,
    NanoserveEngine,
    Setup,
    Skipped,
    release_models,
)
from nanoserve.bench.vllm_engine import VllmEngine
from nanoserve.bench.workload import Workload, wave_accounting


def make_engine(name: str, s: Setup, wl: Workload):
    """The named engine, loaded for ``s``; ``wl`` sizes hf-cb's batch tokens."""
    if name == "nanoserve":
        return NanoserveEngine(s)
    if name == "hf":
        return HFGenerateEngine(s)
    if name == "hf-cb":
        return HFContinuousEngine(s, max(len(p) for p in wl.prompts))
    if name == "vllm":
        return VllmEngine(s)
    raise ValueError(f"unknown engine {name!r}; choose from {ENGINES}")


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _fail(row: dict, live: dict, name: str, reason: str) -> None:
    row.update(status="error", reason=reason)
    live.pop(name).close()


def run_offline(setup: Setup, wl: Workload, engines=ENGINES, rounds: int = 3,
                warmup: bool = True, log=None) -> dict:
    """Load each engine, warm it up, then time the engines in turn for ``rounds`` rounds.

    Returns the rows (one per engine: ``status`` "ok", "skipped" or "error", the reason, tokens/s
    per round and their median, the ratio nanoserve/engine) and each engine's token ids."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; choose from {list(ENGINES)}")
    say = log or (lambda msg: None)
    rows: dict[str, dict] = {}
    live: dict[str, object] = {}
    tokens: dict[str, list[list[int]]] = {}
    try:
        for name in engines:
            row = rows[name] = {"engine": name, "status": "ok", "reason": None, "version": None,
                                "threads": None, "notes": [], "rounds_s": [],
                                "tokens_per_s": None}
            say(f"loading {name}")
            t0 = time.perf_counter()
            try:
                e = make_engine(name, setup, wl)
            except Skipped as err:
                row.update(status="skipped", reason=str(err))
                continue
            except Exception as err:  # a peer that fails is reported as failed, never faked
                if name == "nanoserve" and isinstance(err, ValueError):
                    raise  # LLM refused an option: the caller's mistake, not a row
                row.update(status="error", reason=_reason(err))
                continue
            row.update(version=e.version, threads=e.threads, notes=e.notes,
                       load_s=round(time.perf_counter() - t0, 2))
            live[name] = e
        if warmup:
            for name, e in list(live.items()):
                say(f"warming up {name}")
                try:
                    e.run(wl.head(setup.batch, max_tokens=8))
                except Exception as err:
                    _fail(rows[name], live, name, f"warm-up: {_reason(err)}")
        order = list(live)
        for r in range(rounds):
            k = r % max(1, len(order))  # rotate: each engine takes each place in turn
            for name in order[k:] + order[:k]:
                if name not in live:
                    continue
                say(f"round {r + 1}/{rounds}: {name}")
                _sync(setup.device)
                t0 = time.perf_counter()
                try:
                    out = live[name].run(wl)
                except Exception as err:
                    _fail(rows[name], live, name, f"round {r + 1}: {_reason(err)}")
                    continue
                _sync(setup.device)
                wall = time.perf_counter() - t0
                # vLLM's own generate time, without the pipe to its process (a millisecond)
                wall = getattr(live[name], "last_wall_s", None) or wall
                got = [len(t) for t in out]
                if got != wl.max_tokens:
                    _fail(rows[name], live, name,
                          f"returned {sum(got)} tokens, not {wl.useful_tokens}")
                    continue
                rows[name]["rounds_s"].append(round(wall, 4))
                tokens.setdefault(name, out)
    finally:
        for e in live.values():
            e.close()
        release_models()
    _summarize(rows, tokens, wl, setup.batch)
    return {"rows": list(rows.values()), "token_ids": tokens}


def _reason(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"


def _summarize(rows: dict, tokens: dict, wl: Workload, batch: int) -> None:
    """Medians, tokens/s, ratios against nanoserve and token agreement, into the rows."""
    base = None
    for name, row in rows.items():
        if row["status"] == "ok" and row["rounds_s"]:
            med = statistics.median(row["rounds_s"])
            row.update(wall_s=round(med, 4), tokens_per_s=round(wl.useful_tokens / med, 2),
                       tokens_per_s_rounds=[round(wl.useful_tokens / w, 2)
                                            for w in row["rounds_s"]])
        if name == "nanoserve":
            base = row["tokens_per_s"]
    ref = tokens.get("nanoserve")
    for name, row in rows.items():
        row["nanoserve_ratio"] = (round(base / row["tokens_per_s"], 3)
                                  if base and row["tokens_per_s"] else None)
        if ref is not None and name in tokens:
            row["same_tokens_as_nanoserve"] = sum(a == b for a, b in zip(tokens[name], ref,
                                                                         strict=True))
    if "hf" in rows:
        rows["hf"]["static_waves"] = wave_accounting(wl.max_tokens, batch)

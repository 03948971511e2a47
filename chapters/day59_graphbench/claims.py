"""Day 59's numbers: what ``make gpu-check`` runs on a lent card, the arms it compares, two runs
of those arms on this CPU (counts, plus loose timed rows), and the card's rows, which state what
a card is expected to show and are read from the committed ``results/*.json`` once a card has
written them (skipped until then).

The reduced CPU run is the card's path rehearsed: ``graphbench.run_arms`` on nanoserve-tiny in
float32, one ``nanoserve serve`` child process per arm on a free port of 127.0.0.1 (stopped
after its arm), arms ``graphs`` and ``no-compile`` with exactly the card's flags, 16 requests of
4 prompt ids and 16 output tokens at rate inf, 8 slots, ``max_model_len`` 64. The ``eager`` arm
(``--compile`` with every step through the compiled forward) is left to the card: inductor would
spend longer building C++ on this 2-core machine than the whole run takes.

The full-size CPU run is the card's workload (``gpu_check.WORKLOAD`` at ``gpu_check.RATES``) on
nanoserve-tiny, arms ``no-compile`` and the control ``free-rows`` (the windows with
``compact_rows=False``), each server on a thread of this process so that the scheduler's own
counters (compactions, row moves, preemptions) can be read after the load; the requests still
go over HTTP. Every count comes from the engine's counters or the client's records.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
import time

from chapters.common import ROOT, SHIPPED
from chapters.runner import bound, exact, gpu, timed

from .snapshot.itl import ARMS as FROZEN_ARMS
from .snapshot.itl import itl_split

CPU_ARMS = ("graphs", "no-compile")
CPU_RUN = dict(requests=16, input_len=4, output_len=16, max_num_seqs=8, max_model_len=64,
               dtype="float32")
FULL_ARMS = ("no-compile", "free-rows")
NAMES = {"free-rows": "compact_rows=False"}  # the control, as the log spells it


def gpu_check():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_check as module
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return module


def stages() -> str:
    return ", ".join(stage.name for stage in gpu_check().stages())


def results_files() -> str:
    """The files the plan writes, by the chapter whose results/ they land in."""
    by_day: dict[str, list[str]] = {}
    for stage in gpu_check().stages():
        for path in stage.writes:
            day = int(path.parent.parent.name[3:5])
            by_day.setdefault(f"Day {day}", []).append(path.name)
    return "; ".join(f"{day} {', '.join(names)}" for day, names in sorted(by_day.items()))


def card_parameters() -> str:
    """What the weights stage will write, counted from the shapes alone (nothing drawn)."""
    import math

    return f"{sum(math.prod(s) for s in gpu_check().weight_shapes().values()):,}"


def card_workload() -> str:
    m = gpu_check()
    w = m.WORKLOAD
    return (f"arms {', '.join(m.ARMS)}; rates {', '.join(f'{r:g}' for r in m.RATES)} req/s; "
            f"{w['requests']} requests of {w['input_len']} in / {w['output_len']} out per rate; "
            f"{w['max_num_seqs']} slots; max_model_len {w['max_model_len']}; "
            f"budget {m.BUDGET_S:g} s")


def arm_flags() -> str:
    from nanoserve.bench.graphbench import ARMS, DEFAULT_ARMS

    return "; ".join(f"{a}: {' '.join(ARMS[a])}" for a in DEFAULT_ARMS)


def control_flags() -> str:
    from nanoserve.bench.graphbench import ARMS

    return " ".join(ARMS["free-rows"])


def frozen_arms() -> str:
    from nanoserve.bench.graphbench import ARMS

    same = sum(ARMS[a] == flags for a, flags in FROZEN_ARMS.items())
    return f"{same} of {len(FROZEN_ARMS)} identical"


def on_this_cpu() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = gpu_check().main([])
    said = "says it measures nothing" if "nothing is measured" in out.getvalue() else "silent"
    return f"exit {rc}, {said}"


def recorded_run(**kw) -> dict:
    """``graphbench.run_arms(**kw)`` with ``calculate_metrics`` wrapped, so that each rate's
    per-request records (one list per row of the report, in its order) stay available for the
    frozen ITL split."""
    import nanoserve.bench.serve as bs
    from nanoserve.bench import graphbench

    original, seen = bs.calculate_metrics, []

    def recording(outputs, duration_s):
        seen.append([o for o in outputs if o.success])
        return original(outputs, duration_s)

    bs.calculate_metrics = recording
    t0 = time.perf_counter()
    try:
        report = graphbench.run_arms(str(SHIPPED), "cpu", **kw)
    finally:
        bs.calculate_metrics = original
    return {"report": report, "records": seen, "wall_s": time.perf_counter() - t0}


@functools.cache
def cpu_run() -> dict:
    """The reduced arms, each a ``nanoserve serve`` child process."""
    return recorded_run(rates=[float("inf")], arms=CPU_ARMS, **CPU_RUN)


@functools.cache
def full_run() -> dict:
    """The card's workload on nanoserve-tiny: no-compile and the compact_rows=False control,
    served in this process so that the engine's own counters come with each row."""
    m = gpu_check()
    return recorded_run(rates=list(m.RATES), arms=FULL_ARMS, dtype="float32", in_process=True,
                        **m.WORKLOAD)


def rows() -> dict:
    return {r["arm"]: r for r in cpu_run()["report"]["rows"]}


def windows() -> str:
    return cpu_run()["report"]["windows"].split(" (")[0]


def per_arm(fn) -> str:
    return ", ".join(f"{arm} {fn(r, i)}" for i, (arm, r) in enumerate(rows().items()))


def completed() -> str:
    recs = cpu_run()["records"]
    return per_arm(lambda r, i: f"{len(recs[i])} completed, {r['failed']} failed")


def shares() -> str:
    return per_arm(lambda r, i: f"{r['share']:.0%}")


def gaps() -> str:
    recs = cpu_run()["records"]
    return per_arm(lambda r, i: f"{sum(o.output_tokens for o in recs[i])} tokens, "
                                f"{sum(len(o.itl) for o in recs[i])} gaps")


def gate() -> str:
    verdicts = cpu_run()["report"]["gates"]
    return "; ".join(f"{arm} {v.split(' ')[0]}" for arm, v in verdicts.items())


def frozen_split(run: dict | None = None) -> str:
    run = run or cpu_run()
    agree = total = 0
    for row, recs in zip(run["report"]["rows"], run["records"], strict=True):
        p50, p99 = itl_split([o.itl for o in recs])
        total += 2
        agree += (abs(p50 - row["itl_p50_ms"]) < 1e-6) + (abs(p99 - row["itl_p99_ms"]) < 1e-6)
    return f"{agree} of {total} agree"


# ---- the full-size run: one row per arm and rate, counters per arm


def full_arms() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row, recs in zip(full_run()["report"]["rows"], full_run()["records"], strict=True):
        out.setdefault(row["arm"], []).append(row | {"records": recs})
    return out


def per_full_arm(fn) -> str:
    return "; ".join(f"{NAMES.get(arm, arm)} {fn(rows)}" for arm, rows in full_arms().items())


def full_workload() -> str:
    r = full_run()["report"]
    w = r["workload"]
    return (f"arms {', '.join(NAMES.get(a, a) for a in full_arms())}; rates "
            f"{', '.join(f'{x:g}' for x in w['rates'])} req/s; {w['requests']} requests of "
            f"{w['input_len']} in / {w['output_len']} out per rate; {r['batch_size']} slots; "
            f"max_model_len {r['max_model_len']}; servers {r['servers']}; windows "
            f"{r['windows'].split(' (')[0]}")


def full_completed() -> str:
    return per_full_arm(lambda rows: f"{sum(len(r['records']) for r in rows)} completed, "
                                     f"{sum(r['failed'] for r in rows)} failed")


def full_gaps() -> str:
    def both(rows):
        recs = [o for r in rows for o in r["records"]]
        return (f"{sum(o.output_tokens for o in recs):,} tokens, "
                f"{sum(len(o.itl) for o in recs):,} gaps")

    return per_full_arm(both)


def counter(arm: str, key: str):
    """One of the engine's counters for ``arm``: counted over all its rates, so every row of
    the arm carries the same value."""
    values = {r[key] for r in full_arms()[arm]}
    if len(values) != 1:
        raise AssertionError(f"{arm}: {key} differs between its rows: {values}")
    return values.pop()


def no_compile_replays() -> str:
    steps, scattered = counter("no-compile", "decode_steps"), counter("no-compile", "scattered")
    every = "all" if scattered == steps > 0 else "not all"
    return f"{counter('no-compile', 'replayed')} replayed; {every} scattered"


def control_share() -> float:
    return counter("free-rows", "replayed") / counter("free-rows", "decode_steps")


def control_gate() -> str:
    return full_run()["report"]["gates"]["free-rows"].split(" ")[0]


def control_compactor() -> str:
    mode = "persistent" if counter("free-rows", "compact_rows") else "free"
    return (f"{counter('free-rows', 'compactions')} compactions, "
            f"{counter('free-rows', 'moves')} row moves, {mode} mode")


def preemptions() -> str:
    return per_full_arm(lambda rows: str(counter(rows[0]["arm"], "preemptions")))


# ---- the card's results: read from results/*.json, which only make gpu-check writes


def arm_rows(data: list[dict], arm: str) -> list[dict]:
    return sorted((r for r in data if r["arm"] == arm), key=lambda r: float(r["rate"]))


def below(data: list[dict], key: str, low: str, high: str) -> str:
    a, b = arm_rows(data, low), arm_rows(data, high)
    ok = len(a) == len(b) > 0 and all(x[key] < y[key] for x, y in zip(a, b, strict=True))
    return "yes" if ok else "no"


FULL = "full-size arms"
CARD = "expected on the card"
CLAIMS = [
    exact("`make gpu-check`: its stages, in order", stages),
    exact("results files it writes, by chapter", results_files),
    exact("the card's run", card_workload),
    exact("random Llama-3.2-1B-shaped weights it writes: parameters, counted from the shapes",
          card_parameters),
    exact("each arm's `nanoserve serve` flags", arm_flags),
    exact("the frozen arms against graphbench's", frozen_arms),
    exact("the control arm's flags (compact_rows=False)", control_flags),
    exact("`tools/gpu_check.py` on this CPU", on_this_cpu),
    exact("reduced arms on this CPU: the windows", windows),
    exact("reduced arms: requests per arm", completed),
    exact("reduced arms: replay share per arm", shares),
    exact("reduced arms: output tokens and ITL gaps per arm", gaps),
    exact("reduced arms: the replay gate on the graphed arm", gate),
    exact("reduced arms: ITL p50 and p99, frozen split against the benchmark's", frozen_split),
    timed("reduced arms, 2-core x86 CPU: ITL p99 of either arm",
          lambda: max(r["itl_p99_ms"] for r in rows().values()) / 1e3),
    timed("reduced arms, 2-core x86 CPU: ITL p50, graphs arm / no-compile arm (eager replay)",
          lambda: rows()["graphs"]["itl_p50_ms"] / rows()["no-compile"]["itl_p50_ms"]),
    timed("reduced arms, 2-core x86 CPU: wall time, both servers included",
          lambda: cpu_run()["wall_s"]),
    exact(f"{FULL} on this CPU: what ran", full_workload),
    exact(f"{FULL}: requests per arm", full_completed),
    exact(f"{FULL}: output tokens and ITL gaps per arm", full_gaps),
    exact(f"{FULL}: ITL p50 and p99, frozen split against the benchmark's",
          lambda: frozen_split(full_run())),
    exact(f"{FULL}, no-compile: decode steps replayed, the engine's counters",
          no_compile_replays),
    bound(f"{FULL}, no-compile (persistent batch): compactions, the engine's compactor",
          lambda: counter("no-compile", "compactions")),
    exact(f"{FULL}, compact_rows=False: the engine's compactor", control_compactor),
    bound(f"{FULL}, compact_rows=False: replay share, the engine's counters", control_share),
    exact(f"{FULL}, compact_rows=False: the replay gate", control_gate),
    exact(f"{FULL}: preemptions per arm, the engine's counters", preemptions),
    timed(f"{FULL}, 2-core x86 CPU: ITL p99, any arm and rate",
          lambda: max(r["itl_p99_ms"] for r in full_run()["report"]["rows"]) / 1e3),
    timed(f"{FULL}, 2-core x86 CPU: wall time, both servers included",
          lambda: full_run()["wall_s"]),
    gpu(f"{CARD}: `pytest -m gpu`", "gpu-tests.json", "passed",
        fmt=lambda ok: "pass" if ok else "fail"),
    gpu(f"{CARD}: weights written, parameters", "gpu-weights.json", "parameters",
        fmt="{:,}".format),
    gpu(f"{CARD}: requests failed, every arm and rate", "graphbench-arms.json", "rows",
        fmt=lambda rs: str(sum(r["failed"] for r in rs))),
    gpu(f"{CARD}: replay share of the graphs arm, lowest over the rates",
        "graphbench-arms.json", "rows",
        fmt=lambda rs: f"{min(r['share'] for r in arm_rows(rs, 'graphs')):.0%}"),
    gpu(f"{CARD}: the replay gate on the graphs arm", "graphbench-arms.json", "gates",
        fmt=lambda g: g.get("graphs", "missing").split(" ")[0]),
    gpu(f"{CARD}: ITL p50, graphs below eager at every rate", "graphbench-arms.json",
        "rows", fmt=lambda rs: below(rs, "itl_p50_ms", "graphs", "eager")),
    gpu(f"{CARD}: ITL p50, eager below no-compile at every rate", "graphbench-arms.json",
        "rows", fmt=lambda rs: below(rs, "itl_p50_ms", "eager", "no-compile")),
]

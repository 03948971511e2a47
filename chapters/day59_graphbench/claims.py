"""Day 59's numbers: what ``make gpu-check`` runs on a lent card, the arms it compares, a reduced
run of those arms on this CPU (counts only, plus loose timed rows), and the card's results,
read from the committed ``results/*.json`` once a card has written them.

The CPU run: ``graphbench.run_arms`` on nanoserve-tiny in float32, one ``nanoserve serve`` per
arm on a free port of 127.0.0.1 (stopped after its arm), arms ``graphs`` and ``no-compile``
with exactly the card's flags, 16 requests of 4 prompt ids and 16 output tokens at rate inf,
8 slots, ``max_model_len`` 64. The ``eager`` arm (``--compile`` with every step through the
compiled forward) is left to the card: inductor would spend longer building C++ on this
2-core machine than the whole run takes.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import sys
import time

from chapters.common import ROOT, SHIPPED
from chapters.runner import exact, gpu, timed

from .snapshot.itl import ARMS as FROZEN_ARMS
from .snapshot.itl import itl_split

CPU_ARMS = ("graphs", "no-compile")
CPU_RUN = dict(requests=16, input_len=4, output_len=16, max_num_seqs=8, max_model_len=64,
               dtype="float32")


def gpu_check():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_check as module
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return module


def stages() -> str:
    return ", ".join(name for name, _ in gpu_check().stages(ROOT / "build"))


def results_files() -> str:
    source = (ROOT / "tools" / "gpu_check.py").read_text()
    return ", ".join(re.findall(r'results\.write\("([\w.-]+\.json)"', source))


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


@functools.cache
def cpu_run() -> dict:
    """The reduced arms; ``calculate_metrics`` is wrapped so each rate's per-request records
    stay available for the frozen ITL split."""
    import nanoserve.bench.serve as bs
    from nanoserve.bench import graphbench

    original, seen = bs.calculate_metrics, []

    def recording(outputs, duration_s):
        seen.append([o for o in outputs if o.success])
        return original(outputs, duration_s)

    bs.calculate_metrics = recording
    t0 = time.perf_counter()
    try:
        report = graphbench.run_arms(str(SHIPPED), "cpu", [float("inf")], arms=CPU_ARMS,
                                     **CPU_RUN)
    finally:
        bs.calculate_metrics = original
    return {"report": report, "records": seen, "wall_s": time.perf_counter() - t0}


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


def frozen_split() -> str:
    agree = total = 0
    for i, r in enumerate(rows().values()):
        p50, p99 = itl_split([o.itl for o in cpu_run()["records"][i]])
        total += 2
        agree += (abs(p50 - r["itl_p50_ms"]) < 1e-6) + (abs(p99 - r["itl_p99_ms"]) < 1e-6)
    return f"{agree} of {total} agree"


# ---- the card's results: read from results/*.json, which only make gpu-check writes


def arm_rows(data: list[dict], arm: str) -> list[dict]:
    return sorted((r for r in data if r["arm"] == arm), key=lambda r: float(r["rate"]))


def below(data: list[dict], key: str, low: str, high: str) -> str:
    a, b = arm_rows(data, low), arm_rows(data, high)
    ok = len(a) == len(b) > 0 and all(x[key] < y[key] for x, y in zip(a, b, strict=True))
    return "yes" if ok else "no"


CLAIMS = [
    exact("`make gpu-check`: its stages, in order", stages),
    exact("results files it writes into this chapter", results_files),
    exact("the card's run", card_workload),
    exact("each arm's `nanoserve serve` flags", arm_flags),
    exact("the frozen arms against graphbench's", frozen_arms),
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
    gpu("on the card: `pytest -m gpu`", "gpu-tests.json", "passed",
        fmt=lambda ok: "pass" if ok else "fail"),
    gpu("on the card: random Llama-3.2-1B-shaped weights, parameters", "gpu-weights.json",
        "parameters", fmt="{:,}".format),
    gpu("on the card: requests failed, every arm and rate", "graphbench-arms.json", "rows",
        fmt=lambda rs: str(sum(r["failed"] for r in rs))),
    gpu("on the card: replay share of the graphs arm, lowest over the rates",
        "graphbench-arms.json", "rows",
        fmt=lambda rs: f"{min(r['share'] for r in arm_rows(rs, 'graphs')):.0%}"),
    gpu("on the card: the replay gate on the graphs arm", "graphbench-arms.json", "gates",
        fmt=lambda g: g.get("graphs", "missing").split(" ")[0]),
    gpu("on the card: ITL p50, graphs below eager at every rate", "graphbench-arms.json",
        "rows", fmt=lambda rs: below(rs, "itl_p50_ms", "graphs", "eager")),
    gpu("on the card: ITL p50, eager below no-compile at every rate", "graphbench-arms.json",
        "rows", fmt=lambda rs: below(rs, "itl_p50_ms", "eager", "no-compile")),
]

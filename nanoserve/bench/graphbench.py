"""How much of a decode loop a recorded graph can replay, by workload shape and by scheduler.

Why this module exists: a captured decode graph reads the window ``slots[:n]``, so it can only
replay a step whose decode rows are 0..n-1. Whether they are depends on the scheduler, not on the
graph: the free-row heap leaves survivors stranded above the holes that completions make, and the
persistent batch (``Scheduler(compact_rows=True)``, ``nanoserve.engine.compact``) moves them down.
This harness counts both, with no model and no device: the real ``Scheduler`` over a real
``KVCacheManager`` with integer tokens, exactly as ``bench sched`` drives it.

Conventions, pinned:

- a *decode step* is an iteration whose schedule has at least one decode row; an iteration that
  only prefills is not one;
- every batch size from 1 to the slot count has a bucket in the capture list, so a step
  *replays* exactly when its decode rows are a prefix 0..n-1 (``cuda.buckets.is_compact``, which the
  capture's ``rows_are_a_prefix`` asks); otherwise it is *scattered*;
- a move's *cells* are its source row's cached length at the moment it moves: the prompt plus
  the tokens generated so far, less the last one, which the next forward writes;
- request ``i`` wants ``gen_lens[i % len(gen_lens)]`` tokens (as in ``bench sched``); prompts
  are ``prompt_len`` tokens (4 by default); the pool holds every request's worst case, so
  nothing is ever preempted and the two schedulers differ only in where the rows are.

``--coverage`` prints the Day-58 table (both schedulers over eight workload shapes) and writes
it as CSV; a single run prints one JSON object:

    nanoserve bench graph --coverage --csv build/day-58-graphbench.csv
    nanoserve bench graph --slots 8 --requests 16 --gen-lens 4,8,16,32 --mode persistent --json

The arms over sockets (``--weights DIR --device cuda --rates 1,2,4,8``) live in ``arms.py``
(``run_arms``, ``render_arms``, re-exported here): one ``nanoserve serve`` per arm, driven by
the serving benchmark's seeded load, each arm's replay counters read off ``/metrics``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

# the arms' names are re-exported: the CLI and callers look for them here
from nanoserve.bench.arms import (  # noqa: F401
    ARM_COLUMNS,
    ARMS,
    DEFAULT_ARMS,
    render_arms,
    replay_counters,
    run_arms,
)
from nanoserve.bench.gates import (
    GateFailed,
    ScheduleRecord,
    check_arm_replayed_every_step,
    check_moves_amortised,
    check_moves_minimal,
)
from nanoserve.engine.compact import COMPACTION_MODES, RowCompactor, is_compact
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler

TOKEN = 1  # every generated token; nothing here looks at values
BLOCK_SIZE = 16
DEFAULT_CSV = Path("build") / "day-58-graphbench.csv"

# (slots, requests, gen lengths): the rows of the Day-58 table, run once per scheduler
COVERAGE_SHAPES = (
    (4, 8, (16,)), (4, 8, (8, 16)), (4, 8, (4, 32)),
    (8, 16, (16,)), (8, 16, (8, 16)), (8, 16, (4, 32)), (8, 16, (4, 8, 16, 32)),
    (16, 32, (4, 32)),
)
MODE_LABEL = {"free": "free rows", "persistent": "persistent"}
COLUMNS = ("batch", "slots", "requests", "gen lengths", "decode steps", "replayed", "scattered",
           "share", "moves", "cells")


def run_coverage(slots: int, requests: int, gen_lens: list[int], prompt_len: int = 4,
                 mode: str = "free", records: list[ScheduleRecord] | None = None,
                 compactor: RowCompactor | None = None) -> dict:
    """One workload through one scheduler; the counts of the module docstring.

    ``records``, if given, receives one ``ScheduleRecord`` per schedule for the gates.
    ``compactor`` replaces the scheduler's own (the tests break the gates with one)."""
    if mode not in COMPACTION_MODES:
        raise ValueError(f"mode={mode!r}; choose one of {COMPACTION_MODES}")
    if slots < 1 or requests < 1 or prompt_len < 1:
        raise ValueError("--slots, --requests and --prompt-len must be >= 1")
    if not gen_lens or min(gen_lens) < 1:
        raise ValueError("every --gen-lens entry must be >= 1")
    worst = prompt_len + max(gen_lens)
    pool = KVCacheManager(slots * -(-worst // BLOCK_SIZE), BLOCK_SIZE)
    sched = Scheduler(pool, slots, allocation="incremental", compact_rows=mode == "persistent")
    if compactor is not None:
        sched.compactor = compactor
    cells = 0

    def on_move(src: int, dst: int) -> None:  # the host stand-in for the cache's move_row
        nonlocal cells
        tenant = next(r for r in sched.running if r.slot == src)
        cells += tenant.num_tokens - 1  # cached: everything but the token the next step writes

    sched.compactor.on_move = on_move
    for i in range(requests):
        sched.add(Request(i, [TOKEN] * prompt_len, max_tokens=gen_lens[i % len(gen_lens)]))
    decode_steps = replayed = 0
    while True:
        out = sched.schedule()
        if records is not None:
            records.append(ScheduleRecord.of(out))
        if out.num_scheduled == 0:
            if sched.has_unfinished():
                raise RuntimeError("nothing schedulable while requests wait: a deadlock")
            break
        if out.decode:
            decode_steps += 1
            replayed += is_compact(r.slot for r in out.decode)
        for r in out.admitted + out.decode:
            r.append_token(TOKEN)
        sched.check_invariants()
    assert pool.num_free == pool.num_blocks, "a block leaked"
    assert sched.preemptions == 0, "the pool was sized so that nothing is preempted"
    c = sched.compactor
    return {
        "decode_steps": decode_steps, "replayed": replayed,
        "scattered": decode_steps - replayed,
        "share": round(replayed / decode_steps, 4) if decode_steps else 1.0,
        "moves": c.moves, "cells": cells,
        # not in the JSON: what the compactor's three counters said
        "_counters": {"calls": c.calls, "compactions": c.compactions, "moves": c.moves},
    }


def coverage_table(prompt_len: int = 4) -> list[dict]:
    """The Day-58 table: every shape under the free-row heap, then under the persistent batch."""
    rows = []
    for mode in COMPACTION_MODES:
        for slots, requests, gen in COVERAGE_SHAPES:
            res = run_coverage(slots, requests, list(gen), prompt_len, mode)
            rows.append({"batch": MODE_LABEL[mode], "slots": slots, "requests": requests,
                         "gen lengths": "/".join(map(str, gen)),
                         "decode steps": res["decode_steps"], "replayed": res["replayed"],
                         "scattered": res["scattered"], "share": f"{res['share']:.0%}",
                         "moves": res["moves"], "cells": res["cells"]})
    return rows


# The log's layout, to the character: right-aligned fields of these widths. The header's last
# three fields sit one column right of the values under them, as they do in the log.
HEADER_WIDTHS = (10, 7, 10, 15, 14, 10, 11, 8, 7, 8)
ROW_WIDTHS = (10, 7, 10, 15, 14, 10, 11, 7, 7, 8)
TABLE_TITLE = ("Day 58 coverage, host only: decode steps a recorded window could replay, per "
               "scheduler and workload (every batch size has a bucket):")


def render_table(rows: list[dict]) -> str:
    """The Day-58 table as the log prints it (values wider than the log's are not cut)."""
    def line(cells, widths):
        return "".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True))

    return "\n".join([line(COLUMNS, HEADER_WIDTHS)] +
                     [line([r[c] for c in COLUMNS], ROW_WIDTHS) for r in rows])


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coverage", action="store_true",
                   help="the Day-58 table: both schedulers over eight shapes, host only")
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="where --coverage writes")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--gen-lens", default="4,8,16,32",
                   help="comma-separated; request i wants gen_lens[i %% len] tokens")
    p.add_argument("--prompt-len", type=int, default=4)
    p.add_argument("--mode", choices=COMPACTION_MODES, default="free")
    p.add_argument("--json", action="store_true", help="print the single run as JSON")
    # the arms over sockets: see run_arms
    p.add_argument("--weights", default=None, help="checkpoint folder: run the arms over HTTP")
    p.add_argument("--device", default="cuda", help="the arms' device (cuda or cpu)")
    p.add_argument("--rates", default="1,2,4,8", help="request rates per second, per arm")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated, from {', '.join(ARMS)}")
    p.add_argument("--arm-requests", type=int, default=64, help="requests per rate")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=8, help="the arms' batch size")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--dtype", default=None)
    p.add_argument("--out", type=Path, default=None, help="write the arms' report as JSON")


def main(args: argparse.Namespace) -> int:
    try:
        if args.weights is not None:
            report = run_arms(args.weights, args.device,
                              [float(x) for x in args.rates.split(",")],
                              [a for a in args.arms.split(",") if a], args.arm_requests,
                              args.input_len, args.output_len, args.max_num_seqs,
                              args.max_model_len, args.dtype)
            print(render_arms(report))
            if args.out is not None:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(report, indent=1) + "\n")
                print(f"wrote {args.out}")
            return 0
        if args.coverage:
            rows = coverage_table(args.prompt_len)
            print(TABLE_TITLE)
            print(render_table(rows))
            write_csv(rows, args.csv)
            print(f"wrote {args.csv}")
            return 0
        gen_lens = [int(x) for x in args.gen_lens.split(",")]
        records: list[ScheduleRecord] = []
        result = run_coverage(args.slots, args.requests, gen_lens, args.prompt_len, args.mode,
                              records)
    except (ValueError, RuntimeError) as e:
        print(f"nanoserve bench graph: error: {e}")
        return 2
    counters = result.pop("_counters")
    if args.json:
        print(json.dumps(result))
        return 0
    for k, v in {**result, **counters}.items():
        print(f"{k:>13} {v}")
    for verdict in gate_verdicts(result, records, f"{args.mode} rows"):
        print(verdict)
    return 0


def gate_verdicts(result: dict, records: list[ScheduleRecord], arm: str) -> list[str]:
    """The three Day-58 gates over one run, each as "PASS ..." or "FAIL ..." (a free-row run
    is expected to fail the first)."""
    gates = (("check_arm_replayed_every_step", lambda: check_arm_replayed_every_step(
                result["decode_steps"], result["replayed"], arm)),
             ("check_moves_minimal", lambda: check_moves_minimal(records)),
             ("check_moves_amortised", lambda: check_moves_amortised(records)))
    verdicts = []
    for name, gate in gates:
        try:
            verdicts.append(f"PASS {name}: {gate()}")
        except GateFailed as e:
            verdicts.append(f"FAIL {name}: {e}")
    return verdicts

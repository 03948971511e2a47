"""Day 58's numbers: the coverage table row by row, what the moves cost on the real engine, the
gates' verdicts, Day 57's windows over the persistent batch, the tokens with compaction on
against off, and Day 56's sixteen flag combinations counted for replays and compilations.

Host counts come from the package's harness (``nanoserve bench graph --coverage``) and are held
against the frozen snapshot's; the model claims run nanoserve-tiny in float32 on one thread, the
windows in eager replay (no CUDA here), through Day 57's own worst-shape run.
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

from chapters.common import SHIPPED, one_thread
from chapters.day56_flags.claims import matrix as flag_matrix
from chapters.day57_graph_capture.claims import counters as window_counters
from chapters.day57_graph_capture.claims import padding as window_padding
from chapters.runner import exact

from .snapshot import compact as snap
from .snapshot.coverage import COVERAGE_SHAPES, MODE_LABEL, Scheduler, SchedulerOutput
from .snapshot.coverage import coverage_table as snapshot_table
from .snapshot.coverage import run_coverage as snapshot_run

README = Path(__file__).with_name("README.md")
WORST = (8, 16, [4, 8, 16, 32])  # the shape the free-row heap handles worst


def label(mode: str, slots: int, requests: int, gen: tuple[int, ...]) -> str:
    return f"{MODE_LABEL[mode]}: {slots} slots, {requests} requests, gen {'/'.join(map(str, gen))}"


@functools.cache
def package_table() -> tuple[dict, ...]:
    from nanoserve.bench.graphbench import coverage_table

    return tuple(coverage_table())


def table_row(mode: str, slots: int, requests: int, gen: tuple[int, ...]) -> str:
    """The package's row for this scheduler and shape, found by its cells, not its position."""
    key = (MODE_LABEL[mode], slots, requests, "/".join(map(str, gen)))
    r = next(r for r in package_table()
             if (r["batch"], r["slots"], r["requests"], r["gen lengths"]) == key)
    return (f"{r['decode steps']} steps: {r['replayed']} replayed, {r['scattered']} scattered, "
            f"{r['share']}; {r['moves']} moves, {r['cells']} cells")


def snapshot_agrees() -> str:
    same = sum(a == b for a, b in zip(snapshot_table(), package_table(), strict=True))
    return f"{same} of {len(package_table())} identical"


def prose_table_agrees() -> str:
    """The README's prose table (one row per shape, both schedulers side by side), read back and
    held against the harness, so the prose copy cannot drift from the numbers table."""
    lines = README.read_text().splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| slots | requests |"))
    cols = [c.strip() for c in lines[head].strip().strip("|").split("|")]
    body = itertools.takewhile(lambda ln: ln.startswith("|"), lines[head + 2:])
    printed = [dict(zip(cols, (c.strip() for c in ln.strip().strip("|").split("|")),
                        strict=True)) for ln in body]
    by_shape = {(r["slots"], r["requests"], r["gen lengths"], r["batch"]): r
                for r in package_table()}
    agree = 0
    for p in printed:
        key = (int(p["slots"]), int(p["requests"]), p["gen lengths"])
        free, pers = by_shape.get((*key, "free rows")), by_shape.get((*key, "persistent"))
        if free is None or pers is None:
            continue
        agree += 2 * (p["decode steps"] == str(free["decode steps"]) == str(pers["decode steps"])
                      and (p["free rows: share"], p["free rows: replayed"])
                      == (free["share"], str(free["replayed"]))
                      and (p["persistent: share"], p["persistent: replayed"])
                      == (pers["share"], str(pers["replayed"]))
                      and (p["moves"], p["cells"]) == (str(pers["moves"]), str(pers["cells"]))
                      and free["moves"] == free["cells"] == 0)
    return f"{agree} of {len(package_table())} rows agree"


@functools.cache
def worst(mode: str) -> tuple[dict, tuple]:
    records: list[snap.ScheduleRecord] = []
    return snapshot_run(*WORST, mode=mode, records=records), tuple(records)


def iterations() -> str:
    res, _ = worst("persistent")
    return f"{res['schedules']}, {res['iterations']}, {res['decode_steps']}"


def counters() -> str:
    res, records = worst("persistent")
    two = sum(len(r.moves) == 2 for r in records)
    return (f"{res['calls']} calls, {res['compactions']} compactions, {res['moves']} moves; "
            f"{two} schedules filled two holes each")


@functools.cache
def shipped_worst() -> dict:
    """The worst shape on the real engine: every move the scheduler asked the cache for."""
    from nanoserve import LLM, SamplingParams

    slots, requests, gen = WORST
    with one_thread():
        llm = LLM(SHIPPED, dtype="float32", compact_rows=True, max_num_seqs=slots,
                  max_model_len=64, skip_tokenizer_init=True)
        compactor, moved = llm.core.scheduler.compactor, []
        relabel = compactor.on_move  # the engine's move_row: returns the cells it copied

        def spy(src: int, dst: int) -> int:
            moved.append((src, dst, relabel(src, dst)))
            return moved[-1][2]

        compactor.on_move = spy
        llm.generate([[0, 5 + i, 9, 11] for i in range(requests)],
                     [SamplingParams(temperature=0, max_tokens=gen[i % len(gen)], ignore_eos=True)
                      for i in range(requests)])
    cache = llm.engine.cache
    cells = cache.slots.cells
    layers, _, kv_heads, head_dim = cache.k.shape  # (L, pool cells, H_kv, D)
    return {"moves": moved, "itemsize": cells.element_size(),
            "dtype": str(cells.dtype).removeprefix("torch."),
            "kv_per_token": 2 * layers * kv_heads * head_dim * cache.k.element_size()}


def bytes_arithmetic() -> str:
    m = shipped_worst()
    cells = sum(n for *_, n in m["moves"])
    return f"{len(m['moves'])} moves, {cells} {m['dtype']}, {cells * m['itemsize']} bytes"


def per_token() -> str:
    m = shipped_worst()
    return f"{m['kv_per_token']:,} against {m['itemsize']}"


def engine_matches_harness() -> str:
    engine = [(s, d) for s, d, _ in shipped_worst()["moves"]]
    host = [(m.src, m.dst) for r in worst("persistent")[1] for m in r.moves]
    same = (sum(a == b for a, b in zip(engine, host, strict=True))
            if len(engine) == len(host) else 0)
    cells = (sum(n for *_, n in shipped_worst()["moves"]), worst("persistent")[0]["cells"])
    return f"{same} of {len(host)} identical, {cells[0]} cells against {cells[1]}"


def gate_outcomes(res: dict, records) -> list[bool]:
    gates = (lambda: snap.check_arm_replayed_every_step(res["decode_steps"], res["replayed"]),
             lambda: snap.check_moves_minimal(records),
             lambda: snap.check_moves_amortised(records))
    passed = []
    for gate in gates:
        try:
            gate()
            passed.append(True)
        except snap.GateFailed:
            passed.append(False)
    return passed


def gates_over(mode: str) -> str:
    tally = [0, 0, 0]
    for slots, requests, gen in COVERAGE_SHAPES:
        records: list[snap.ScheduleRecord] = []
        res = snapshot_run(slots, requests, list(gen), mode=mode, records=records)
        tally = [t + p for t, p in zip(tally, gate_outcomes(res, records), strict=True)]
    return f"{', '.join(map(str, tally))} of {len(COVERAGE_SHAPES)} pass"


def free_replay_gate() -> str:
    res, _ = worst("free")
    try:
        return "passes: " + snap.check_arm_replayed_every_step(res["decode_steps"],
                                                               res["replayed"])
    except snap.GateFailed as e:
        n, of = re.search(r"(\d+) of (\d+) decode steps fell through", str(e)).groups()
        return f"fails: {n} of {of} fell through"


def amortised_gate() -> str:
    try:
        return "passes: " + snap.check_moves_amortised(worst("persistent")[1])
    except snap.GateFailed as e:
        return f"fails: {e}"


class SlidingCompactor(snap.RowCompactor):
    """The tempting wrong compaction: keep the rows in admission order by sliding every tenant
    above a hole down. It leaves a prefix every time, and pays for rows already in place."""

    def plan(self, rows):
        return [snap.RowMove(r, i) for i, r in enumerate(sorted(rows)) if r != i]


def sliding() -> str:
    records: list[snap.ScheduleRecord] = []
    res = snapshot_run(*WORST, mode="persistent", records=records,
                       compactor=SlidingCompactor("persistent"))
    verdict = "passes" if gate_outcomes(res, records)[1] else "fails"
    return f"{res['share']:.0%}, {res['moves']} moves, {res['cells']} cells, {verdict}"


class AdmitFirst(Scheduler):
    """The other order: admit, then compact. This step's decode batch is still the survivors
    alone (a newcomer is prefilled now and decodes from the next iteration)."""

    def schedule(self):
        self.schedule_calls += 1
        out = SchedulerOutput(finished=self._release_finished())
        out.preempted = self._grow_running()
        survivors = list(self.running)
        out.admitted = self._admit()
        newcomers = {r.slot for r in out.admitted}
        out.moves = self._compact()
        self.newcomers_moved += sum(m.src in newcomers for m in out.moves)
        out.decode = survivors
        return out

    newcomers_moved = 0


def admit_first() -> str:
    made: list[AdmitFirst] = []

    class Counted(AdmitFirst):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    res = snapshot_run(*WORST, mode="persistent", scheduler=Counted)
    return (f"{res['replayed']} of {res['decode_steps']} replayed, {res['moves']} moves, "
            f"{res['cells']} cells, {made[0].newcomers_moved} newcomers moved")


def hand_example() -> str:
    rows = [1, 3, 4]
    plan = " ".join(m.render() for m in snap.plan_compaction(rows))
    return f"{snap.holes(rows)}, {snap.strays(rows)}, {plan}"


def replays() -> str:
    return ", ".join("yes" if snap.is_compact(r) else "no" for r in ((2, 0, 1), (0, 2)))


def every_occupancy() -> str:
    good = total = 0
    for k in range(11):
        for rows in itertools.combinations(range(10), k):
            total += 1
            plan = snap.plan_compaction(rows)
            after = (set(rows) - {m.src for m in plan}) | {m.dst for m in plan}
            good += (len(snap.holes(rows)) == len(snap.strays(rows)) == len(plan)
                     and snap.is_compact(after))
    return f"{good:,} of {total:,}"


def cramped_requests() -> tuple[list[list[int]], list]:
    """The cramped pool's twelve greedy requests: prompts of 6 to 9 ids, 4 to 34 new tokens
    each, EOS ignored, so a pool of 20 four-token blocks must preempt."""
    from nanoserve import SamplingParams

    prompts = [[0, *range(3 + i, 8 + i + i % 4)] for i in range(12)]
    params = [SamplingParams(temperature=0, max_tokens=(4, 8, 16, 32)[i % 4] + i % 3,
                             ignore_eos=True) for i in range(12)]
    return prompts, params


@functools.cache
def tokens_on_off() -> str:
    """Twelve greedy requests through a pool small enough to preempt, compaction off then on."""
    from nanoserve import LLM

    prompts, params = cramped_requests()
    runs = {}
    with one_thread():
        for on in (False, True):
            llm = LLM(SHIPPED, dtype="float32", block_size=4, max_num_seqs=6, max_model_len=64,
                      num_kv_blocks=20, compact_rows=on, skip_tokenizer_init=True)
            sched, swept = llm.core.scheduler, []
            schedule = sched.schedule

            def watched(schedule=schedule, swept=swept):
                out = schedule()
                swept.append(bool(out.moves and out.preempted))
                return out

            sched.schedule = watched
            runs[on] = ([o.token_ids for o in llm.generate(prompts, params)],
                        llm.stats.preemptions, sched.compactor.moves, sum(swept))
    (off, pre_off, *_), (on, pre_on, moves, swept) = runs[False], runs[True]
    differ = sum(a != b for a, b in zip(off, on, strict=True))
    pre = (f"{pre_on} preemptions each" if pre_on == pre_off
           else f"{pre_off} vs {pre_on} preemptions")
    return (f"{differ} of {len(on)} differ; {pre}; {moves} moves, {swept} of them in a "
            f"schedule that had just preempted")


@functools.cache
def windows_on_off() -> str:
    """Day 57's windows over the persistent batch: twelve greedy requests through a pool small
    enough to preempt, compaction on; windows off, then on."""
    from nanoserve import LLM

    prompts, ps = cramped_requests()
    runs = {}
    with one_thread():
        for graphs in (False, True):
            llm = LLM(SHIPPED, dtype="float32", block_size=4, max_num_seqs=6, max_model_len=64,
                      num_kv_blocks=20, compact_rows=True, cuda_graphs=graphs,
                      skip_tokenizer_init=True, enable_chunked_prefill=False)
            toks = [o.token_ids for o in llm.generate(prompts, ps)]
            s = llm.stats
            runs[graphs] = (toks, s.preemptions, llm.core.scheduler.compactor.moves,
                            s.decode_steps, s.decode_steps_replayed)
    (off, pre_off, mv_off, *_), (on, pre_on, mv_on, steps, replayed) = runs[False], runs[True]
    differ = sum(a != b for a, b in zip(off, on, strict=True))
    same = "each" if (pre_off, mv_off) == (pre_on, mv_on) else f"vs {pre_off}, {mv_off}"
    return (f"{differ} of {len(on)} differ; {pre_on} preemptions and {mv_on} moves {same}; "
            f"{replayed} of {steps} decode steps replayed")


def flag_shares() -> str:
    """Day 56's sixteen engines (compile x attention x windows x compaction), rerun now that the
    windows and the persistent batch exist: the replay share of each pairing of the two, the
    same whichever compile and attention read ran beside it (else every value seen)."""
    def share(graphs: bool, compact: bool) -> str:
        got = {f"{r['share']:.0%}" for r in flag_matrix()
               if (r["graphs"], r["compact"]) == (graphs, compact)}
        return got.pop() if len(got) == 1 else "/".join(sorted(got))

    return (f"{share(True, True)}, {share(True, False)}, {share(False, True)}, "
            f"{share(False, False)}")


def flag_compiles() -> str:
    """The same runs, compiled through dynamo over the gathered read: decode compilations per
    run, in the matrix's order (windows off then on; free rows then persistent)."""
    got = [r["compiles"] for r in flag_matrix()
           if r["compile"] and r["attention"] == "gathered"]
    return ", ".join(map(str, got))


CLAIMS = [
    *(exact(label(mode, *shape), functools.partial(table_row, mode, *shape))
      for mode in MODE_LABEL for shape in COVERAGE_SHAPES),
    exact("the same sixteen rows from the frozen snapshot", snapshot_agrees),
    exact("the table under *Why it matters*, read back against the harness (two harness rows "
          "per line)",
          prose_table_agrees),
    exact("worst shape: schedule() calls, iterations that ran the model, decode steps",
          iterations),
    exact("worst shape, persistent: the compactor's counters", counters),
    exact("nanoserve-tiny, worst shape, `compact_rows=True`: moves, cells, bytes (arithmetic: "
          "cells counted from the engine's moves × the slot table's element size)",
          bytes_arithmetic),
    exact("nanoserve-tiny float32, per cached token: K/V bytes against the slot-table bytes a "
          "move copies", per_token),
    exact("nanoserve-tiny against the host harness, worst shape: the moves in order, and cells",
          engine_matches_harness),
    exact("gates over the eight persistent runs (replayed every step, minimal, amortised)",
          lambda: gates_over("persistent")),
    exact("gates over the eight free-row runs (same order)", lambda: gates_over("free")),
    exact("worst shape, free rows: `check_arm_replayed_every_step`", free_replay_gate),
    exact("worst shape, persistent: `check_moves_amortised`", amortised_gate),
    exact("sliding compactor, worst shape: share replayed, moves, cells, `check_moves_minimal`",
          sliding),
    exact("compaction after admission instead, worst shape", admit_first),
    exact("rows (1, 3, 4): holes, strays, plan", hand_example),
    exact("does a step replay? rows (2, 0, 1), rows (0, 2)", replays),
    exact("every occupancy of rows 0-9: strays = holes = plan length, and the plan leaves a "
          "prefix", every_occupancy),
    exact("nanoserve-tiny, cramped pool, greedy float32, compaction off vs on", tokens_on_off),
    exact("worst shape, windows with the persistent batch", lambda: window_counters(True)),
    exact("worst shape, persistent batch: padding", lambda: window_padding(True)),
    exact("cramped pool (12 requests, 6 slots, block size 4, 20 blocks), compaction on, greedy "
          "float32: windows off vs on", windows_on_off),
    exact("replay share: graphs + persistent, graphs + free rows, persistent alone, neither",
          flag_shares),
    exact("decode compilations per run, gathered read (graphs off: free, persistent; graphs on: "
          "free, persistent)", flag_compiles),
]

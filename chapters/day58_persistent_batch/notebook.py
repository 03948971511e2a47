# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 58 notebook: keeping the running rows a prefix
#
# A recorded decode window for `n` rows reads rows `0 .. n-1` of the slot table and nothing
# else, so a step can replay only when its rows are exactly those. This notebook is mostly
# host bookkeeping, no model needed; one part builds a small paged cache from the shipped
# nanoserve-tiny model to watch a move happen. In about ten seconds on a CPU:
#
# 1. an occupancy drawn as rows, with its holes and strays, and the plan that fixes it;
# 2. the free-row heap stranding a survivor above an empty row;
# 3. the same requests with `compact_rows=True`: one compaction, by hand;
# 4. a move on a real paged cache: the addressing moves, K and V do not;
# 5. `move_row` refusing a destination that is in use;
# 6. the coverage table, and the gates on the worst shape, including a compactor that only
#    `check_moves_minimal` can catch.
#
# Graph capture and replay are Day 57's; everything here is about which rows a step uses.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from nanoserve import LLM
from nanoserve.bench import graphbench
from nanoserve.bench.gates import (
    GateFailed,
    check_arm_replayed_every_step,
    check_moves_amortised,
    check_moves_minimal,
)
from nanoserve.engine.compact import (
    RowCompactor,
    RowMove,
    holes,
    is_compact,
    move_cells,
    plan_compaction,
    strays,
)
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler

torch.set_num_threads(1)


def draw(rows, num_rows: int, label: str = "") -> None:
    """One line per cache row, top row first: who is there, and what the planner calls it."""
    h, s = set(holes(rows)), set(strays(rows))
    print(label)
    for r in reversed(range(num_rows)):
        mark = "hole" if r in h else "stray" if r in s else ""
        cell = "[####]" if r in rows else "[    ]"
        print(f"  row {r} {cell} {mark}")
    print(f"  compact: {is_compact(rows)}")


# %% [markdown]
# ## 1. Holes and strays
#
# Three requests hold rows 1, 3 and 4 of a six-row cache. Three tenants belong in rows 0 to 2,
# so the empty places there are *holes* and the tenants above are *strays*. There are always
# as many of one as of the other, which is why a compaction never allocates anything.

# %%
rows = [1, 3, 4]
draw(rows, 6, "before:")
plan = plan_compaction(rows)
print("plan:", [m.render() for m in plan])
after = sorted((set(rows) - {m.src for m in plan}) | {m.dst for m in plan})
draw(after, 6, "after:")

# %% [markdown]
# The price of a plan is its moves and the cells each move copies: the source row's cached
# length. Give the three rows some lengths and price the plan:

# %%
lengths = {1: 20, 3: 37, 4: 12}
print("cached lengths:", lengths)
print(move_cells(plan, lengths), "cells, i.e.", move_cells(plan, lengths) * 8,
      "bytes of int64 addressing")

# %% [markdown]
# ## 2. The free-row heap strands a survivor
#
# Four requests over four slots; request 0 wants 3 tokens and the others 8. Each gets the
# lowest free row and keeps it. When request 0 finishes, the other three are left in rows 1-3
# and every decode step after that is scattered.

# %%
def step_kind(rows) -> str:
    if not rows:
        return "prefill only, not a decode step"
    return "replay" if is_compact(rows) else "scattered"


def run(compact: bool, verbose: bool = True):
    sched = Scheduler(KVCacheManager(64, 4), 4, allocation="incremental",
                      compact_rows=compact)
    for i, want in enumerate((3, 8, 8, 8)):
        sched.add(Request(i, [7] * 4, max_tokens=want))
    it = 0
    while (out := sched.schedule()).num_scheduled:
        it += 1
        rows = sorted(r.slot for r in out.decode)
        if verbose and (out.moves or out.finished or it <= 2):
            print(f"it {it:2d}: finished {[r.request_id for r in out.finished]!s:6s} "
                  f"moves {[m.render() for m in out.moves]!s:10s} decode rows {rows} "
                  f"-> {step_kind(rows)}")
        for r in out.admitted + out.decode:
            r.append_token(1)
    return sched


free = run(compact=False)
print(free.compactor)

# %% [markdown]
# ## 3. The same requests, compacted
#
# With `compact_rows=True` the schedule that releases request 0 also moves the highest tenant
# down into row 0, before this iteration's decode batch is formed. One move, and every step
# stays a prefix.

# %%
persistent = run(compact=True)
print(persistent.compactor)

# %% [markdown]
# ## 4. A move on a real paged cache
#
# Row 2 of a three-row cache gets a five-token prompt through the shipped model. Then
# `move_row(2, 0)` hands it to row 0. The BlockTables trade places, the slot-table row is
# copied across, and the K/V pool is exactly what it was, in the same storage.

# %%
llm = LLM(SHIPPED, dtype="float32", max_num_seqs=3, max_model_len=64, block_size=4,
          skip_tokenizer_init=True)
engine, cache = llm.engine, llm.engine.cache
engine.grant(2, 5)
engine.prefill([2], [[0, 5, 9, 11, 13]])
k_before, v_before, k_ptr = cache.k.clone(), cache.v.clone(), cache.k.data_ptr()
blocks, addressing = list(cache.tables[2].blocks), cache.slots.cells[2, :5].tolist()
print("row 2 before: blocks", blocks, "cells", addressing, "length", cache.lengths[2])

copied = engine.move_row(2, 0)
print("cells copied:", copied)
print("row 0 after:  blocks", cache.tables[0].blocks, "cells",
      cache.slots.cells[0, :5].tolist(), "length", cache.lengths[0])
print("row 2 after:  blocks", cache.tables[2].blocks, "length", cache.lengths[2],
      "all -1:", bool((cache.slots.cells[2] == -1).all()))
print("K and V unchanged:", torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before),
      "| same storage:", cache.k.data_ptr() == k_ptr)
L, _, H, D = cache.k.shape
print(f"per cached token: {2 * L * H * D * cache.k.element_size():,} bytes of K/V, "
      f"{cache.slots.cells.element_size()} bytes of addressing moved")

# %% [markdown]
# ## 5. A refusal, not a repair
#
# Row 1 gets a prompt too. A plan that tried to move row 0 onto it was made for a different
# occupancy; carrying it out would overwrite row 1's addressing. `move_row` refuses.

# %%
engine.grant(1, 3)
engine.prefill([1], [[0, 6, 8]])
try:
    engine.move_row(0, 1)
except ValueError as e:
    print("refused:", e)
try:
    RowMove(2, 2)
except ValueError as e:
    print("refused:", e)

# %% [markdown]
# ## 6. The table, and the gates
#
# The coverage harness runs both schedulers over the eight shapes of the chapter's table, with
# integer tokens and no model.

# %%
print(graphbench.render_table(graphbench.coverage_table()))

# %% [markdown]
# On the worst shape, the three gates pass on the persistent batch and the first two fail on
# free rows. Then a *sliding* compactor, which keeps rows in admission order by shifting every
# tenant above a hole down one: every step still replays, so only the gates that count moves
# give it away.

# %%
WORST = (8, 16, [4, 8, 16, 32])


class Sliding(RowCompactor):
    def plan(self, rows):
        return [RowMove(r, i) for i, r in enumerate(sorted(rows)) if r != i]


def gates(label: str, res: dict, records) -> None:
    print(f"{label}: {res['replayed']} of {res['decode_steps']} replayed, {res['moves']} moves, "
          f"{res['cells']} cells")
    for gate in (lambda: check_arm_replayed_every_step(res["decode_steps"], res["replayed"]),
                 lambda: check_moves_minimal(records), lambda: check_moves_amortised(records)):
        try:
            print("   PASS", gate())
        except GateFailed as e:
            print("   FAIL", e)


for label, kw in (("free rows", dict(mode="free")), ("persistent", dict(mode="persistent")),
                  ("sliding", dict(mode="persistent", compactor=Sliding("persistent")))):
    records = []
    res = graphbench.run_coverage(*WORST, records=records, **kw)
    gates(label, res, records)

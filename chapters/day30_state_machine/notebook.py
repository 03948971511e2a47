# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 30 notebook: the scheduler by hand, over integer tokens
#
# No model in this notebook. Every decision the scheduler makes is bookkeeping, so it can be
# driven by hand with a real `BlockAllocator` and made-up token ids, and every number below is
# a count that comes out the same on any machine. In a few seconds on a CPU:
#
# 1. the transition table, and the edges it refuses;
# 2. the stop rules' order inside `append_token`;
# 3. one `schedule()` call releasing a finished request and refilling its slot;
# 4. the door check, the two ways admission can be blocked, and FIFO without skip-ahead;
# 5. what the worst-case reservation costs (`reservation_waste`), and `abort` in each state;
# 6. the host-only harness on the Day-29 shape, for 8 and for 24 requests;
# 7. what the reversed order (admit, then release) would cost.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

from chapters.common import DAY29_MAX_TOKENS
from chapters.day30_state_machine.snapshot import request as day30
from nanoserve.bench.schedbench import run_scheduled, run_static
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import IllegalTransition, Request, RequestState
from nanoserve.engine.scheduler import Scheduler, SchedulerOutput

W, R, F = RequestState.WAITING, RequestState.RUNNING, RequestState.FINISHED
EOS = 2


def req(i, prompt_len=5, max_tokens=4):
    return Request(i, [7] * prompt_len, max_tokens=max_tokens, eos_token_ids=frozenset({EOS}))


def step(s: Scheduler, token: int = 5) -> SchedulerOutput:
    """One iteration without a model: schedule, then one token for every scheduled request."""
    out = s.schedule()
    for r in out.admitted + out.decode:
        r.append_token(token)
    s.check_invariants()
    return out


def ids(rs) -> list:
    return [r.request_id for r in rs]


# %% [markdown]
# ## 1. The machine is a table
#
# `_LEGAL_TRANSITIONS` maps each state to the states it may move to. Day 30's table, frozen in
# the snapshot, has three edges. Running -> waiting is not among them: that move would be
# preemption, and nothing yet can give a running request's blocks back and rebuild its cache.

# %%
def edges(table) -> set:
    return {(a.value, b.value) for a, bs in table.items() for b in bs}


print("Day 30 (snapshot):", sorted(edges(day30._LEGAL_TRANSITIONS)))

# %% [markdown]
# Every pair of states outside the table raises, and a refused move changes nothing. The
# self-transitions are refused too: asking a running request to become running is a caller
# bug, and treating it as a harmless no-op would hide that bug.

# %%
def in_state(module, state_name: str):
    r = module.Request("x", [7] * 5, max_tokens=4)
    if state_name != "waiting":
        r.transition(module.RequestState.RUNNING)
    if state_name == "finished":
        r.transition(module.RequestState.FINISHED)
    return r


for src in ("waiting", "running", "finished"):
    for dst in ("waiting", "running", "finished"):
        r = in_state(day30, src)
        try:
            r.transition(day30.RequestState(dst))
            verdict = "legal"
        except day30.IllegalTransition as e:
            verdict = f"IllegalTransition ({e}); still {r.state.value}"
        print(f"{src:>8} -> {dst:<8} {verdict}")

# %% [markdown]
# `append_token` is the only way a running request takes a token, and it is refused in any
# other state.

# %%
try:
    req(0).append_token(5)
except IllegalTransition as e:
    print("IllegalTransition:", e)

# %% [markdown]
# ## 2. Which stop rule fires
#
# EOS (and `stop_token_ids`, and stop strings once a detokenizer is attached) is checked before
# the budget. A request whose last budgeted token is EOS therefore finishes with "stop":
# the model ended the answer, the budget did not cut it.

# %%
for last in (5, EOS):
    r = req(0, max_tokens=2)
    r.transition(R)
    r.append_token(5)
    r.append_token(last)
    print(f"tokens [5, {last}] with max_tokens=2 -> {r.finish_reason!r}, "
          f"stop_reason={r.stop_reason!r}")

# %% [markdown]
# ## 3. Release, then admit, in one call
#
# Two slots, three requests. `a` wants one token, so the prefill of iteration 1 finishes it.
# The next `schedule()` releases `a` first, then admits `c` into the row `a` just gave up
# (the lowest free one, 0), so row 0 is busy again in iteration 2.

# %%
s = Scheduler(KVCacheManager(64, 4), max_num_seqs=2)
a, b, c = req("a", max_tokens=1), req("b", max_tokens=3), req("c")
for r in (a, b, c):
    s.add(r)
for it in (1, 2, 3):
    out = step(s)
    print(f"iteration {it}: finished {ids(out.finished)}, admitted {ids(out.admitted)}, "
          f"decode {ids(out.decode)} | slots: b={b.slot} c={c.slot} | "
          f"waiting {ids(s.waiting)}")

# %% [markdown]
# ## 4. The door, the two resources, and the queue
#
# The door check in `add` refuses a request whose worst case (prompt plus `max_tokens`) would
# not fit even in an empty pool. Without it the request would sit at the head of a FIFO queue
# forever and block everyone behind it.

# %%
s = Scheduler(KVCacheManager(4, 4), max_num_seqs=4)
try:
    s.add(req("huge", prompt_len=10, max_tokens=10))
except ValueError as e:
    print("ValueError:", e)
print("waiting after the refusal:", ids(s.waiting))

# %% [markdown]
# Admission can stop for two different reasons, and the scheduler counts them separately.
# With one slot and a big pool, the second request waits for a slot while blocks are free.
# With four slots and a 3-block pool, the second request waits for blocks while slots are free.

# %%
full = Scheduler(KVCacheManager(64, 4), max_num_seqs=1)
for i in range(2):
    full.add(req(i))
step(full)
print(f"batch full: blocked_on_slots={full.blocked_on_slots}, "
      f"blocked_on_blocks={full.blocked_on_blocks}, "
      f"free blocks {full.kv_cache_manager.num_free} of 64")

dry = Scheduler(KVCacheManager(3, 4), max_num_seqs=4)
for i in range(2):
    dry.add(req(i, prompt_len=4, max_tokens=8))  # 12 tokens: all 3 blocks each
step(dry)
print(f"pool dry:   blocked_on_slots={dry.blocked_on_slots}, "
      f"blocked_on_blocks={dry.blocked_on_blocks}, running {len(dry.running)} of 4 slots")

# %% [markdown]
# FIFO without skip-ahead: `big` does not fit beside `long`, and `small` would. `small` still
# waits behind `big`, because a queue that lets small requests pass a blocked large one can keep
# the large one waiting for ever.

# %%
s = Scheduler(KVCacheManager(10, 4), max_num_seqs=4)
s.add(req("long", prompt_len=4, max_tokens=24))  # 7 blocks
s.add(req("big", prompt_len=4, max_tokens=12))  # 4 blocks: 3 are left
s.add(req("small", prompt_len=1, max_tokens=1))  # 1 block: would fit, is not looked at
out = step(s)
print(f"admitted {ids(out.admitted)}, waiting {ids(s.waiting)}, "
      f"free blocks {s.kv_cache_manager.num_free}, blocked_on_blocks {s.blocked_on_blocks}")

# %% [markdown]
# ## 5. What the worst case costs
#
# Admission reserves blocks for the prompt plus the whole budget, so a running request can
# never run out of memory mid-flight. Four requests with 8-token prompts and 200-token budgets,
# block_size 16: each reserves the blocks for 208 tokens, while after the prefill it holds 9
# tokens, which occupy one block.

# %%
s = Scheduler(KVCacheManager(64, 16), max_num_seqs=4)
reqs = [req(i, prompt_len=8, max_tokens=200) for i in range(4)]
for r in reqs:
    s.add(r)
step(s)
reserved = sum(len(r.blocks) for r in reqs)
occupied = sum(s.kv_cache_manager.blocks_for_length(r.num_tokens) for r in reqs)
print(f"{reserved} blocks reserved against {occupied} occupied: "
      f"reservation_waste = {s.reservation_waste():.2f}")

one = Scheduler(KVCacheManager(64, 16), max_num_seqs=4)
r = req("eos", prompt_len=8, max_tokens=200)
one.add(r)
one.schedule()
r.append_token(EOS)  # the very first token ends it
print(f"EOS as the first token: {len(r.blocks)} blocks held, "
      f"{one.kv_cache_manager.blocks_for_length(r.num_tokens)} occupied")

# %% [markdown]
# `abort` works in each live state: a waiting request leaves the queue, a running one gives
# its slot and blocks back at once (through `on_release`, as an engine would use it). Either
# way the next `schedule()` reports it among the finished, and a finished request cannot be
# aborted again.

# %%
released = []
s = Scheduler(KVCacheManager(16, 4), max_num_seqs=1, on_release=lambda r: released.append(
    (r.request_id, r.slot, list(r.blocks))))
run, wait = req("run", max_tokens=20), req("wait")
s.add(run)
s.add(wait)
step(s)
s.abort(wait)
s.abort(run)
print(f"on_release saw {released}; free blocks {s.kv_cache_manager.num_free} of 16")
print(f"next schedule() reports finished {ids(s.schedule().finished)}, "
      f"reasons {run.finish_reason!r}, {wait.finish_reason!r}")
try:
    s.abort(run)
except ValueError as e:
    print("ValueError:", e)

# %% [markdown]
# ## 6. The Day-29 shape through the harness
#
# `nanoserve bench sched` drives the same `Scheduler` with integer tokens. Its conventions:
# an iteration is one `schedule()` and one model step, counted as a forward pass when it
# schedules anything; the prefill produces a request's first token; *issued* counts rows
# computed, *useful* counts tokens kept. Eight requests, 5-token prompts, seven want 4 tokens
# and one wants 32, eight slots, block_size 4, a 1,024-token pool.

# %%
args = dict(slots=8, block_size=4, pool_tokens=1024, prompt_len=5, gen_lens=DAY29_MAX_TOKENS)
for n in (8, 24):
    sc = run_scheduled(**args, requests=n)
    st = run_static(slots=8, prompt_len=5, gen_lens=DAY29_MAX_TOKENS, requests=n)
    print(f"--- {n} requests")
    for name, x in (("static", st), ("scheduled", sc)):
        print(f"{name:>10}: forward passes {x['forward_passes']:3d}, issued "
              f"{x['issued_tokens']:3d}, useful {x['useful_tokens']:3d}, "
              f"occupancy {x['occupancy']:.3f}")
    print(f"  scheduled: {sc['schedule_calls']} schedule() calls (the last one only hands back "
          f"answers), blocked_on_slots {sc['blocked_on_slots']}, "
          f"blocked_on_blocks {sc['blocked_on_blocks']}")
    print(f"  forward work removed {1 - sc['issued_tokens'] / st['issued_tokens']:.1%}, "
          f"makespan {st['forward_passes'] / sc['forward_passes']:.1f}x, "
          f"issued {st['issued_tokens'] / sc['issued_tokens']:.1f}x less")
    print(f"  finish iterations, scheduled: {sc['finish_iteration']}")
    print(f"  handed back, static:          {st['returned_iteration']}")

# %% [markdown]
# The lab log counts its iterations as `schedule()` calls, which include the last call that
# only hands back answers; the chapter divides by forward passes. For the static batch of
# eight, the log counts one pass more per row than our convention, as if the prefill produced
# no token. The cell prints both readings of each figure from the harness's own counts.

# %%
sc, st = run_scheduled(**args, requests=24), run_static(8, 5, DAY29_MAX_TOKENS, 24)
waves, calls, passes = st["forward_passes"], sc["schedule_calls"], sc["forward_passes"]
print(f"makespan: {waves} / {calls} calls = {waves / calls:.2f}x (the log's reading), "
      f"{waves} / {passes} passes = {waves / passes:.2f}x (ours)")
print(f"issued work: {st['issued_tokens']} / {sc['issued_tokens']} = "
      f"{st['issued_tokens'] / sc['issued_tokens']:.2f}x less")
sc8, st8 = run_scheduled(**args, requests=8), run_static(8, 5, DAY29_MAX_TOKENS, 8)
ours, log = st8["issued_tokens"], 8 * (st8["forward_passes"] + 1)
for name, issued in (("ours", ours), ("one pass more per row", log)):
    print(f"static batch of eight, {name}: {issued} issued, scheduler removes "
          f"{1 - sc8['issued_tokens'] / issued:.1%}")

# %% [markdown]
# ## 7. The order that only utilisation notices
#
# The same scheduler with the two phases swapped: admit what fits, then release the finished.
# Every request still gets all its tokens, so a test of outputs passes. But a slot freed by a
# request that finished in iteration N can only be refilled one call later, so each refill
# wave starts an iteration late.

# %%
class AdmitThenRelease(Scheduler):
    def schedule(self) -> SchedulerOutput:
        self.schedule_calls += 1
        chunks = self._admit()  # the prompt work of this step, one Chunk per newcomer
        admitted = [c.request for c in chunks]
        finished = self._release_finished()
        return SchedulerOutput(admitted=admitted, finished=finished, chunks=chunks,
                               decode=[r for r in self.running if r not in admitted])


for cls in (Scheduler, AdmitThenRelease):
    s = cls(KVCacheManager(256, 4), 8)
    reqs = [Request(i, [1] * 5, max_tokens=DAY29_MAX_TOKENS[i % 8]) for i in range(24)]
    for r in reqs:
        s.add(r)
    passes = issued = 0
    while s.has_unfinished():
        out = s.schedule()
        if out.num_scheduled:
            passes += 1
        for r in out.admitted + out.decode:
            issued += 1
            if r.append_token(1):
                r.finish_iteration = passes
    s.schedule()  # hand back the last answers
    print(f"{cls.__name__:>16}: {passes} forward passes, {issued} issued, "
          f"{8 * passes - issued} idle row-iterations, "
          f"every request complete: {all(len(r.output_token_ids) == r.max_tokens for r in reqs)}")

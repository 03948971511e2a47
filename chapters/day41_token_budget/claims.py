"""Day 41's numbers: the token budget, counted without a model and then on nanoserve-tiny.

Three workloads, named once here and used by the notebook, the figure and tests/test_day41.py:

- the worked schedule (``worked_arrivals``, ``worked``), hand-sized: budget 16, block_size 4,
  a 64-block pool, 8 slots; four requests with 3-token prompts and 8 tokens each arrive
  before step 1, and one 40-token prompt wanting 3 tokens arrives before step 2. Counted
  by the live ``Scheduler`` and by the frozen Day 41 snapshot over integer tokens, then run
  on the model.
- ``random_workload(seed)``: seeded random shapes (block size, slots, pool, allocation policy,
  budget or none, chunking on or off, arrivals, aborts) for the step-by-step comparison of the
  package's scheduler with the snapshot's.
- the streaming shape (``STREAMERS`` and the names after it), the timed one: 30 requests
  decoding (16-token prompts) when a 900-token prompt arrives; nanoserve-tiny's context is
  1024 tokens, so the prompt is 900, not longer.

Every claim but the last is an exact count. The last reads a clock: the worst step time while
the long prompt goes in, whole against chunked, as a ratio of two engines timed in one run.
"""

from __future__ import annotations

import functools
import random
import time

from chapters.common import SHIPPED, one_thread
from chapters.runner import exact, timed

from .snapshot.harness import trace
from .snapshot.scheduler import Request as SnapshotRequest
from .snapshot.scheduler import Scheduler as SnapshotScheduler

# ---------------------------------------------------------------- the worked schedule

BUDGET, BLOCK, POOL, SLOTS = 16, 4, 64, 8
SHORTS, SHORT_PROMPT, SHORT_TOKENS = 4, 3, 8
LONG_PROMPT, LONG_TOKENS, LONG_AT = 40, 3, 2


def worked_arrivals(make) -> dict[int, list]:
    """The worked workload; ``make(request_id, prompt_len, max_tokens)`` builds a request."""
    return {1: [make(f"d{i}", SHORT_PROMPT, SHORT_TOKENS) for i in range(SHORTS)],
            LONG_AT: [make("long", LONG_PROMPT, LONG_TOKENS)]}


def _live_request(rid, n, max_tokens):
    from nanoserve.engine.request import Request

    return Request(rid, [1] * n, max_tokens)


def _snapshot_request(rid, n, max_tokens):
    return SnapshotRequest(rid, [1] * n, max_tokens)


def _day33_request(rid, n, max_tokens):
    from chapters.day33_preemption.snapshot.request import Request

    return Request(rid, [1] * n, max_tokens)


class AsDay41:
    """The package's scheduler as the frozen harness reads it: on Day 41 a scheduler's pool was
    ``allocator``; it is now the scheduler's own ``kv_cache_manager``, which counts the same."""

    def __init__(self, scheduler):
        self.scheduler, self.allocator = scheduler, scheduler.kv_cache_manager

    def __getattr__(self, name):
        return getattr(self.scheduler, name)


def live_scheduler(blocks, block_size, slots, allocation="incremental", budget=None,
                   chunked=True):
    from nanoserve.engine.kv_manager import KVCacheManager
    from nanoserve.engine.scheduler import Scheduler

    return AsDay41(Scheduler(KVCacheManager(blocks, block_size), slots, allocation=allocation,
                             max_num_batched_tokens=budget, chunked_prefill=chunked))


def snapshot_scheduler(blocks, block_size, slots, allocation="incremental", budget=None,
                       chunked=True):
    from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator

    return SnapshotScheduler(BlockAllocator(blocks, block_size), slots, allocation=allocation,
                             max_num_batched_tokens=budget, chunked_prefill=chunked)


def day33_scheduler(blocks, block_size, slots, allocation="incremental"):
    from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
    from chapters.day33_preemption.snapshot.scheduler import Scheduler

    return Scheduler(BlockAllocator(blocks, block_size), slots, allocation=allocation)


@functools.cache
def worked(who: str = "live", budget: int | None = BUDGET) -> tuple:
    """The worked schedule as a tuple of Steps: "live" (the package), "snapshot" (Day 41)
    or "day33" (the Day 33 snapshot, which has no budget)."""
    if who == "day33":
        return tuple(trace(day33_scheduler(POOL, BLOCK, SLOTS), worked_arrivals(_day33_request)))
    build, make = ((live_scheduler, _live_request) if who == "live"
                   else (snapshot_scheduler, _snapshot_request))
    return tuple(trace(build(POOL, BLOCK, SLOTS, budget=budget), worked_arrivals(make)))


def per_step(steps) -> str:
    return ", ".join(str(s.tokens) for s in steps)


def long_chunks() -> str:
    got = [(i, n) for i, s in enumerate(worked(), 1) for rid, _, n in s.chunks if rid == "long"]
    return (" + ".join(str(n) for _, n in got) + f" on steps {got[0][0]} to {got[-1][0]}")


def first_token_step(steps, rid: str = "long") -> int:
    return next(i for i, s in enumerate(steps, 1) if rid in s.sampled)


def same_steps(a, b) -> str:
    same = sum(x == y for x, y in zip(a, b, strict=False))
    return f"{same} of {max(len(a), len(b))}"


# ---------------------------------------------------------------- seeded random workloads

RANDOM_SEEDS = range(200)


def random_workload(seed: int) -> dict:
    """A random shape for the package-vs-snapshot comparison. Under a budget without
    chunking the budget holds every request's whole worst case, as the engine's own rule
    (budget >= max_model_len) guarantees: a resumed request must fit whole too."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    slots = rng.randint(1, 6)
    reqs = [(f"r{i}", rng.randint(1, 60), rng.randint(1, 16), rng.randint(1, 12))
            for i in range(rng.randint(1, 10))]
    aborts = {rid: at + rng.randint(0, 8) for rid, _, _, at in reqs if rng.random() < 0.1}
    worst = max(-(-(n + m) // block_size) for _, n, m, _ in reqs)
    mode = rng.choice(["none", "chunked", "chunked", "whole"])
    budget = {"none": None, "chunked": rng.randint(slots, 64),
              "whole": max(slots, *(n + m for _, n, m, _ in reqs)) + rng.randint(0, 16)}[mode]
    return {"block_size": block_size, "slots": slots, "blocks": worst + rng.randint(0, 24),
            "allocation": rng.choice(["incremental", "incremental", "reserve"]),
            "budget": budget, "chunked": mode != "whole", "requests": reqs, "aborts": aborts}


def random_trace(w: dict, who: str) -> list:
    """``who``: "live", "snapshot" or "day33" (the last only for workloads without a budget)."""
    make = {"live": _live_request, "snapshot": _snapshot_request,
            "day33": _day33_request}[who]
    if who == "day33":
        sched = day33_scheduler(w["blocks"], w["block_size"], w["slots"], w["allocation"])
    else:
        build = live_scheduler if who == "live" else snapshot_scheduler
        sched = build(w["blocks"], w["block_size"], w["slots"], w["allocation"], w["budget"],
                      w["chunked"])
    arrivals: dict[int, list] = {}
    aborts: dict[int, list] = {}
    for rid, n, m, at in w["requests"]:
        r = make(rid, n, m)
        arrivals.setdefault(at, []).append(r)
        if rid in w["aborts"]:
            aborts.setdefault(w["aborts"][rid], []).append(r)
    return trace(sched, arrivals, aborts)


@functools.cache
def random_comparison() -> dict:
    """Steps compared, steps that differ, and what the workloads exercised."""
    steps = differ = preempted = cut = day33_steps = day33_differ = 0
    for seed in RANDOM_SEEDS:
        w = random_workload(seed)
        a, b = random_trace(w, "live"), random_trace(w, "snapshot")
        steps += max(len(a), len(b))
        differ += max(len(a), len(b)) - sum(x == y for x, y in zip(a, b, strict=False))
        preempted += sum(len(s.preempted) for s in a)
        cut += sum(1 for s in a for rid, start, n in s.chunks if start > 0)
        if w["budget"] is None:
            c = random_trace(w, "day33")
            day33_steps += max(len(a), len(c))
            day33_differ += max(len(a), len(c)) - sum(x == y for x, y in zip(a, c,
                                                                              strict=False))
    return {"steps": steps, "differ": differ, "preemptions": preempted,
            "continued_chunks": cut, "day33_steps": day33_steps, "day33_differ": day33_differ}


# ---------------------------------------------------------------- on the model


def greedy(max_tokens: int):
    from nanoserve import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def ids(n: int, salt: int = 0) -> list[int]:
    """A deterministic prompt of ``n`` token ids inside nanoserve-tiny's vocabulary (2048)."""
    return [0] + [2 + (salt * 31 + 17 * j) % 2000 for j in range(n - 1)]


def llm(**options):
    from nanoserve import LLM

    return LLM(SHIPPED, dtype="float32", **options)


def drive(lm, arrivals: dict[int, list[tuple]]) -> dict:
    """Step ``lm``'s core; ``arrivals[s]`` is a list of (request id, prompt ids, max_tokens)
    added before step s. Per step: forwards, whether it was mixed, tokens, the long
    request's row length and output; and every request's tokens at the end."""
    import torch

    core = lm.core
    sched, engine = core.scheduler, core.engine
    outs = []
    schedule = sched.schedule

    def recording():
        out = schedule()
        outs.append(out)
        return out

    sched.schedule = recording  # an instance attribute: the class's method is untouched
    reqs, steps = {}, []
    counters = engine.replay_counters
    decodes_before, replayed_before = counters.decode_steps, counters.replayed
    try:
        with torch.inference_mode():
            s = 0
            while s < max(arrivals) or core.has_unfinished():
                s += 1
                for rid, prompt, m in arrivals.get(s, []):
                    reqs[rid] = core.add_request(rid, prompt, greedy(m))
                before = engine.forward_passes
                core.step()
                out = outs[-1]
                if not out.num_scheduled:
                    continue  # it only handed back the last answers
                long = reqs.get("long")
                steps.append({"forwards": engine.forward_passes - before,
                              "mixed": bool(out.mixed and out.chunks and out.decode),
                              "tokens": out.num_batched_tokens,
                              "long_len": None if long is None or long.slot is None
                              else engine.cache.lengths[long.slot],
                              "long_slot": None if long is None else long.slot,
                              "long_out": None if long is None else len(long.output_token_ids)})
    finally:
        del sched.schedule
    core.check_drained()
    return {"steps": steps, "tokens": {k: r.output_token_ids for k, r in reqs.items()},
            "decode_forwards": counters.decode_steps - decodes_before,
            "replayed": counters.replayed - replayed_before}


def worked_on_model(**options) -> dict:
    arrivals = {s: [(r.request_id, ids(len(r.prompt_token_ids), i + 7 * s), r.max_tokens)
                    for i, r in enumerate(rs)]
                for s, rs in worked_arrivals(_live_request).items()}
    with one_thread():
        return drive(llm(block_size=BLOCK, num_kv_blocks=POOL, max_num_seqs=SLOTS, **options),
                     arrivals)


@functools.cache
def worked_engine(chunked: bool = True, graphs: bool = False) -> dict:
    if chunked:
        return worked_on_model(max_num_batched_tokens=BUDGET, cuda_graphs=graphs)
    return worked_on_model(enable_chunked_prefill=False, cuda_graphs=graphs)


# The identity runs: five prompts of these lengths, 12 greedy tokens each, request i added
# before step 1 + 3i so that newcomers land among running decodes.
LENGTHS = (5, 64, 150, 9, 33)
BUDGETS = (dict(max_num_batched_tokens=1, max_num_seqs=1),
           dict(max_num_batched_tokens=5, max_num_seqs=4, block_size=1),
           dict(max_num_batched_tokens=13, block_size=4),
           dict(max_num_batched_tokens=64, max_num_seqs=3),
           dict())  # the default: 512


def identity_arrivals() -> dict[int, list[tuple]]:
    return {1 + 3 * i: [(f"p{i}", ids(n, 100 + i), 12)] for i, n in enumerate(LENGTHS)}


@functools.cache
def identity_runs() -> dict:
    with one_thread():
        whole = drive(llm(enable_chunked_prefill=False), identity_arrivals())
        runs = [drive(llm(**kw), identity_arrivals()) for kw in BUDGETS]
    return {"whole": whole, "chunked": runs}


def identity() -> str:
    r = identity_runs()
    ref = r["whole"]["tokens"]
    differ = sum(run["tokens"][k] != ref[k] for run in r["chunked"] for k in ref)
    return f"{differ} of {len(ref) * len(r['chunked'])}"


def forwards_per_step() -> str:
    r = identity_runs()
    chunked = max(s["forwards"] for run in r["chunked"] for s in run["steps"])
    whole = max(s["forwards"] for s in r["whole"]["steps"])
    mixed = sum(s["mixed"] for run in r["chunked"] for s in run["steps"])
    total = sum(len(run["steps"]) for run in r["chunked"])
    return f"{chunked} and {whole}; {mixed} of {total} chunked steps mixed"


def long_request_on_model() -> str:
    st = [s for s in worked_engine()["steps"] if s["long_slot"] is not None]
    chunk_steps = st[:4]
    lens = ", ".join(str(s["long_len"]) for s in chunk_steps)
    outs = ", ".join(str(s["long_out"]) for s in chunk_steps)
    slots = {s["long_slot"] for s in chunk_steps}
    where = "one slot throughout" if len(slots) == 1 else f"slots {sorted(slots)}"
    return f"{lens}; tokens out {outs}; {where}"


def model_matches_host() -> str:
    a = [s["tokens"] for s in worked_engine()["steps"]]
    b = [s.tokens for s in worked()]
    return "identical" if a == b else f"{a} against {b}"


def model_counts(chunked: bool) -> str:
    run = worked_engine(chunked)
    forwards = sum(s["forwards"] for s in run["steps"])
    return (f"{len(run['steps'])} steps, {forwards} forwards, {run['decode_forwards']} of "
            f"them decodes")


def graphs_claim() -> str:
    run = worked_engine(chunked=True, graphs=True)
    mixed = sum(s["mixed"] for s in run["steps"])
    return (f"{run['replayed']} of {run['decode_forwards']} decode-only steps replayed; "
            f"{mixed} mixed steps eager")


def long_prompt_served() -> str:
    """A 200-token prompt at budget 16 (2 slots), 3 tokens: chunks, first-token step, and
    its tokens against whole prompts."""
    arrivals = {1: [("long", ids(200, 5), 3)]}
    with one_thread():
        chunked = drive(llm(max_num_batched_tokens=16, max_num_seqs=2), arrivals)
        whole = drive(llm(enable_chunked_prefill=False, max_num_seqs=2), arrivals)
    first = next(i for i, s in enumerate(chunked["steps"], 1) if s["long_out"])
    chunks = sum(1 for s in chunked["steps"] if s["long_out"] == 0) + 1
    same = "identical" if chunked["tokens"] == whole["tokens"] else "different"
    return f"{chunks} chunks, first token on step {first}, tokens {same} to whole prompts"


def day36_counts() -> str:
    """Day 36's workload (its 16-block pool, 4 slots): its six-count row's first three, with
    chunking off (as Day 36 pins it) and on at the default budget."""
    from chapters.day36_engine_core.claims import CRAMPED, add_package
    from chapters.day36_engine_core.claims import drive as drive36
    from nanoserve import LLM

    got = []
    with one_thread():
        for chunked in (False, True):
            lm = LLM(SHIPPED, **{**CRAMPED, "enable_chunked_prefill": chunked})
            drive36(lm.core, add_package)
            e = lm.engine
            got.append(f"{lm.core.counters.iterations}, {e.forward_passes}, {e.row_steps}")
    return " then ".join(got)


# ---------------------------------------------------------------- refusals and defaults


def _refusal(fn) -> tuple[str, str]:
    try:
        fn()
    except ValueError as e:
        return type(e).__name__, str(e).split(":")[0]
    return "accepted", ""


def budget_below_seqs() -> str:
    from nanoserve.config import EngineConfig

    got = [_refusal(lambda: EngineConfig(max_num_batched_tokens=4, max_num_seqs=8)),
           _refusal(lambda: live_scheduler(8, 4, 8, budget=4)),
           _refusal(lambda: snapshot_scheduler(8, 4, 8, budget=4))]
    texts = {t for _, t in got}
    said = texts.pop() if len(texts) == 1 else " / ".join(sorted(texts))
    return ", ".join(k for k, _ in got) + ": " + said


def whole_prompts_short_budget() -> str:
    kind, text = _refusal(lambda: llm(max_model_len=512, max_num_batched_tokens=256,
                                      enable_chunked_prefill=False))
    return f"{kind}: {text}"


def default_budgets() -> str:
    on, off = llm().core.scheduler, llm(enable_chunked_prefill=False).core.scheduler
    return f"{on.max_num_batched_tokens}, {off.max_num_batched_tokens}"


# ---------------------------------------------------------------- the streaming workload

STREAMERS, STREAM_PROMPT, STREAM_TOKENS = 30, 16, 64
ARRIVING, ARRIVING_TOKENS, ARRIVE_AFTER = 900, 4, 4  # the long prompt, after 4 decode steps
STREAM_BUDGET, STREAM_BLOCK = 64, 16
STREAM_SLOTS, STREAM_POOL = STREAMERS + 2, 256  # the pool: room for all, never a preemption


@functools.cache
def streaming_engines() -> dict:
    kw = dict(max_num_seqs=STREAM_SLOTS, block_size=STREAM_BLOCK, num_kv_blocks=STREAM_POOL)
    return {"whole": llm(enable_chunked_prefill=False, **kw),
            "chunked": llm(max_num_batched_tokens=STREAM_BUDGET, **kw)}


_round = [0]


def stream_once(lm) -> dict:
    """Thirty decoding, then the long prompt: every step's wall time from its arrival until
    its first token, each of which also carried the thirty decodes. The thirty are all past
    their prefill (which a budget of 64 spreads over several steps) and have streamed for
    ``ARRIVE_AFTER`` more steps when it arrives."""
    import torch

    core = lm.core
    preemptions = core.scheduler.preemptions
    _round[0] += 1
    tag = f"{_round[0]}-"
    with torch.inference_mode():
        streamers = [core.add_request(f"{tag}s{i}", ids(STREAM_PROMPT, i), greedy(STREAM_TOKENS))
                     for i in range(STREAMERS)]
        while not all(r.output_token_ids for r in streamers):
            core.step()  # the thirty prefills
        for _ in range(ARRIVE_AFTER):
            core.step()  # steady streaming
        long = core.add_request(f"{tag}long", ids(ARRIVING, 99), greedy(ARRIVING_TOKENS))
        times = []
        while not long.output_token_ids:
            t = time.perf_counter()
            core.step()
            times.append(time.perf_counter() - t)
        assert not any(r.is_finished for r in streamers), "a streamer ended too soon"
        while core.has_unfinished():
            core.step()
    core.check_drained()
    assert core.scheduler.preemptions == preemptions, "the pool is too small for the shape"
    return {"worst": max(times), "steps": len(times), "times": times}


@functools.cache
def streaming_steps() -> str:
    """Steps from the long prompt's arrival to its first token, untimed: a count."""
    with one_thread():
        e = streaming_engines()
        return f"{stream_once(e['chunked'])['steps']} and {stream_once(e['whole'])['steps']}"


@functools.cache
def streaming_timed(rounds: int = 3) -> dict:
    """Each engine's step times over ``rounds`` interleaved rounds on one thread, after a
    warm-up. Every round runs the same steps, so step k keeps its least disturbed time
    across the rounds; ``worst`` is the slowest step after that. A pause that hits one step
    of one round changes nothing; only a step that is slow every time counts."""
    engines = streaming_engines()
    times: dict[str, list[list[float]]] = {k: [] for k in engines}
    with one_thread():
        for lm in engines.values():
            stream_once(lm)  # warm-up, outside the measurement
        for _ in range(rounds):
            for k, lm in engines.items():
                times[k].append(stream_once(lm)["times"])
    best = {k: [min(step) for step in zip(*runs, strict=True)] for k, runs in times.items()}
    return {k: {"worst": max(b), "steps": len(b), "times": b} for k, b in best.items()}


def worst_step_ratio() -> float:
    t = streaming_timed()
    return t["whole"]["worst"] / t["chunked"]["worst"]


CLAIMS = [
    exact("worked schedule, budget 16: tokens per step", lambda: per_step(worked())),
    exact("the same workload, no budget: tokens per step", lambda: per_step(worked("live", None))),
    exact("the 40-token prompt's chunks", long_chunks),
    exact("step of its first token: budget 16, no budget",
          lambda: f"{first_token_step(worked())}, {first_token_step(worked('live', None))}"),
    exact("most tokens in one step: budget 16, no budget",
          lambda: f"{max(s.tokens for s in worked())}, "
                  f"{max(s.tokens for s in worked('live', None))}"),
    exact("worked schedule, package vs Day 41 snapshot, steps identical",
          lambda: same_steps(worked(), worked("snapshot"))),
    exact("no budget, package vs Day 33 snapshot, steps identical",
          lambda: same_steps(worked("live", None), worked("day33"))),
    exact("200 seeded random workloads, package vs Day 41 snapshot: steps that differ",
          lambda: f"{random_comparison()['differ']} of {random_comparison()['steps']}"),
    exact("what those workloads exercised: preemptions, continued chunks",
          lambda: f"{random_comparison()['preemptions']}, "
                  f"{random_comparison()['continued_chunks']}"),
    exact("their no-budget workloads, package vs Day 33 snapshot: steps that differ",
          lambda: f"{random_comparison()['day33_differ']} of "
                  f"{random_comparison()['day33_steps']}"),
    exact("the worked workload on nanoserve-tiny: tokens per step against the host count",
          model_matches_host),
    exact("the 40-token request on the model, steps 2 to 5: row length; tokens out; slot",
          long_request_on_model),
    exact("the worked workload on the model: budget 16", lambda: model_counts(True)),
    exact("the worked workload on the model: whole prompts", lambda: model_counts(False)),
    exact("greedy outputs that differ from whole prompts, 5 budget settings x 5 prompts",
          identity),
    exact("most forwards in one step, chunked and whole; mixed steps", forwards_per_step),
    exact("a 200-token prompt at budget 16", long_prompt_served),
    exact("`cuda_graphs=True` on the worked workload (eager replay on a CPU)", graphs_claim),
    exact("Day 36's workload: iterations, forward passes, row-steps, chunking off then on",
          day36_counts),
    exact("budget 4 with max_num_seqs 8: EngineConfig, package Scheduler, snapshot Scheduler",
          budget_below_seqs),
    exact("chunking off, budget 256, max_model_len 512", whole_prompts_short_budget),
    exact("default budget on nanoserve-tiny: chunking on, off", default_budgets),
    exact("streaming shape: steps from the 900-token prompt's arrival to its first token, "
          "budget 64 and whole",
          streaming_steps),
    timed("worst step while the 900-token prompt goes in, whole / budget 64 (2-core x86 CPU, "
          "one thread, nanoserve-tiny, float32, 30 decoding rows)", worst_step_ratio,
          fmt="{:.1f}x".format),
]

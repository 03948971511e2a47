"""Day 78's claims: prompt lookup against a draft model on the shipped model.

Three sources:

- **Rerun here** (exact): the shipped model in float32, greedy, end-of-sequence ignored, on
  three workloads of ``REQUESTS`` requests each: *training passages* (the first documents of
  ``text_loss.corpus()``'s training split that hold ``PASSAGE`` tokens: those tokens, BOS
  first, then the ``REOPEN`` tokens after BOS again), *held-out passages* (the same from the
  held-out split) and *no-repeat* prompts (``NOREPEAT`` distinct random ids, seed 0, never BOS
  or EOS). Each workload is one ``generate`` of its requests, ``NEW`` tokens each, with
  speculation off, with prompt lookup and with a draft of the shipped model's first layer
  (``write_truncated_draft``; on ``DRAFT_WORKLOADS`` only, the draft being slow); the counters
  are ``core.snapshot().spec_decode``'s, read before and after. The formula rows are exact
  arithmetic on those counts and on two shapes' weights.
- **Timed** (``make chapter-78`` only): the same arms pinned to one CPU, one request at a time,
  interleaved rounds, best round; and the draft's cost per proposal, timed inside the engine.
- **Recorded** (``results/spec-cpu.json``): ``nanoserve bench spec``, a longer run with more
  requests, two thread counts, a published shape and vLLM's CPU build beside it. Its labels are
  fixed here (``RECORDED``); ``values`` maps each to its stated text. After a bench run,

      python -m chapters.day78_ngram_or_draft.claims --record build/bench/spec.json

  writes the results file and prints the rows to paste over the recorded ones.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import random
import tempfile
import time
from pathlib import Path

from chapters.common import SHIPPED
from chapters.runner import exact, recorded, timed

from .snapshot.lookup import propose, replay
from .snapshot.speedup import break_even_a, predicted_speedup, step_weights

HERE = Path(__file__).resolve().parent
RESULTS = "spec-cpu.json"
K, LOOKUP = 4, (5, 5)  # num_speculative_tokens; prompt_lookup_min, _max (vLLM's defaults)
PASSAGE, REOPEN, NEW, REQUESTS, NOREPEAT = 96, 48, 32, 6, 144
DRAFT_LAYERS, ROUNDS = 1, 7
WORKLOADS = {"train": "training passages", "val": "held-out passages",
             "norepeat": "no-repeat prompts"}
DRAFT_WORKLOADS = ("train", "norepeat")  # the draft is slow here: two make its point
NG = f"n-gram (k {K}, lookup {LOOKUP[0]} to {LOOKUP[1]})"
DR = f"{DRAFT_LAYERS}-layer draft (k {K})"
SMALL_C = 0.05  # an input: a draft a twentieth of the target's weights
COMMAND = ("nanoserve bench spec --threads 1,2 --rounds 3 --vllm --vllm-venv .venv-vllm "
           "--out build/bench/spec.json (make bench-peers; its defaults: float32, --k 4, "
           "--lookups 5:5,2:5, --batch 8, --draft-layers 1)")


# ------------------------------------------------------------------ workloads and runs


@functools.cache
def prompts() -> dict[str, list[list[int]]]:
    """The three workloads' prompts, as token ids (the module docstring)."""
    from nanoserve.model.text_loss import corpus
    from nanoserve.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(str(SHIPPED))
    out = {}
    for split, docs in zip(("train", "val"), corpus(), strict=True):
        ids = (tok.encode(d) for d in docs)
        picked = [d[:PASSAGE] + d[1:1 + REOPEN] for d in ids if len(d) >= PASSAGE]
        out[split] = picked[:REQUESTS]
    rng = random.Random(0)
    out["norepeat"] = [rng.sample(range(2, 2048), NOREPEAT) for _ in range(REQUESTS)]
    return out


def draft_missing() -> str | None:
    try:
        from nanoserve.spec_decode.draft import DraftModelProposer, write_truncated_draft  # noqa
    except ImportError as e:
        return f"the draft_model proposer is not built here ({e})"
    return None


@functools.cache
def draft_dir() -> Path:
    from nanoserve.spec_decode.draft import write_truncated_draft

    out = Path(tempfile.mkdtemp(prefix="nanoserve-day78-")) / f"nanoserve-tiny-L{DRAFT_LAYERS}"
    return write_truncated_draft(SHIPPED, out, DRAFT_LAYERS)


def spec_config(arm: str) -> dict | None:
    if arm == "ngram":
        return {"method": "ngram", "num_speculative_tokens": K,
                "prompt_lookup_min": LOOKUP[0], "prompt_lookup_max": LOOKUP[1]}
    if arm == "draft":
        return {"method": "draft_model", "num_speculative_tokens": K, "model": str(draft_dir())}
    return None


def _counters(llm) -> tuple[int, int, int, list[int]]:
    s = llm.core.snapshot().spec_decode
    if s is None:
        return 0, 0, 0, []
    return s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, list(s.accepted_per_pos)


def _minus(after, before) -> dict:
    pos = [a - (before[3][i] if i < len(before[3]) else 0) for i, a in enumerate(after[3])]
    drafts, proposed, accepted = (a - b for a, b in zip(after[:3], before[:3], strict=True))
    return {"drafts": drafts, "proposed": proposed, "accepted": accepted,
            "per_pos": pos + [0] * (K - len(pos))}


@functools.cache
def run(arm: str) -> dict[str, dict]:
    """One engine (``arm``: off, ngram or draft), each workload one ``generate``: the outputs
    and the counters it added."""
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams

    spec = spec_config(arm)
    llm = LLM(str(SHIPPED), dtype="float32", skip_tokenizer_init=True,
              **({} if spec is None else {"speculative_config": spec}))
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    got = {}
    try:
        for name, ps in prompts().items():
            if arm == "draft" and name not in DRAFT_WORKLOADS:
                continue
            before = _counters(llm)
            outs = [list(o.token_ids) for o in llm.generate(ps, params)]
            got[name] = {"outputs": outs, **_minus(_counters(llm), before)}
    finally:
        llm.shutdown()
    return got


def figures(arm: str, workload: str) -> dict:
    """Verify steps, decode steps, mean acceptance length, acceptance rate, tokens per target
    forward and acceptance per position for one arm on one workload."""
    r = run(arm)[workload]
    written = sum(len(o) - 1 for o in r["outputs"])  # decode steps' tokens, after the prefill
    steps = written - r["accepted"]  # every decode step wrote one token besides the accepted
    d = r["drafts"]
    return {**r, "steps": steps, "mal": 1 + r["accepted"] / d if d else 1.0,
            "rate": r["accepted"] / r["proposed"] if r["proposed"] else 0.0,
            "per_forward": written / steps, "pos_share": [n / d if d else 0.0
                                                          for n in r["per_pos"]]}


def ngram_row(w: str) -> str:
    f = figures("ngram", w)
    return f"{f['drafts']} of {f['steps']}, {f['mal']:.2f}, {f['per_forward']:.2f}"


def draft_row(w: str) -> str:
    f = figures("draft", w)
    return f"{f['drafts']} of {f['steps']}, {f['rate']:.0%}, {f['mal']:.2f}"


def positions(arm: str, w: str) -> str:
    return ", ".join(f"{s:.0%}" for s in figures(arm, w)["pos_share"])


def identical(arm: str) -> str:
    off, on = run("off"), run(arm)
    same = sum(a == b for w in on for a, b in zip(off[w]["outputs"], on[w]["outputs"],
                                                     strict=True))
    return f"{same} of {sum(len(v['outputs']) for v in on.values())}"


def replayed() -> str:
    """Accepted proposals: the engine's counter, and the snapshot's replay over its outputs."""
    got = run("ngram")
    mine = sum(replay(p, o, LOOKUP[0], LOOKUP[1], K).accepted
               for w, ps in prompts().items() for p, o in zip(ps, got[w]["outputs"], strict=True))
    return f"{sum(v['accepted'] for v in got.values())}, {mine}"


def live_lookup_agrees() -> str:
    """The package's ``propose_ngram`` against the snapshot's ``propose`` on every prefix of
    every request's tokens (prompt and lookup's output), past the prompt's first token."""
    from nanoserve.spec_decode.ngram import propose_ngram

    got = run("ngram")
    seqs = [p + o for w, ps in prompts().items() for p, o in zip(ps, got[w]["outputs"],
                                                                  strict=True)]
    pairs = [(s[:n], n) for s in seqs for n in range(2, len(s) + 1)]
    same = sum(propose(t, *LOOKUP, K) == propose_ngram(t, *LOOKUP, K, 1024) for t, _ in pairs)
    return f"{same:,} of {len(pairs):,}"


def doctests() -> str:
    """The snapshot's doctest examples that hold, module by module."""
    import doctest

    from .snapshot import lookup, speedup

    runs = [doctest.testmod(m, optionflags=doctest.NORMALIZE_WHITESPACE) for m in (lookup,
                                                                                   speedup)]
    return ", ".join(f"{r.attempted - r.failed} of {r.attempted}" for r in runs)


# ------------------------------------------------------------------ the formula


@functools.cache
def shape_weights() -> dict[str, int]:
    """Weights a decode step reads: SmolLM2-135M's shape and the shipped model's, whole and
    cut to their first ``DRAFT_LAYERS``."""
    from nanoserve.bench.shapes import SMOLLM2_135M

    shipped = json.loads((SHIPPED / "config.json").read_text())
    out = {}
    for name, cfg in (("smollm2", SMOLLM2_135M), ("shipped", shipped)):
        out[name] = step_weights(cfg, cfg["num_hidden_layers"])
        out[f"{name}-draft"] = step_weights(cfg, DRAFT_LAYERS)
        out[f"{name}-head"] = step_weights(cfg, 0)
    return out


def c_from_weights(name: str) -> float:
    w = shape_weights()
    return w[f"{name}-draft"] / w[name]


def weights_row(name: str) -> str:
    w = shape_weights()
    return ", ".join(f"{w[k] / 1e6:.1f}M" for k in (name, f"{name}-draft", f"{name}-head"))


# ------------------------------------------------------------------ timed


@functools.cache
def timings() -> dict:
    """Decode tokens/s of each arm and workload, one request at a time, pinned to one CPU, the
    arms interleaved, each request's least decode time of ``ROUNDS``; and the draft's seconds
    per proposal over the plain target's seconds per decode step."""
    import os

    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams

    cpu = str(min(os.sched_getaffinity(0)))
    arms = {a: LLM(str(SHIPPED), dtype="float32", skip_tokenizer_init=True, threads_bind=cpu,
                   **({} if spec_config(a) is None else {"speculative_config": spec_config(a)}))
            for a in ("off", "ngram", "draft") if a != "draft" or not draft_missing()}
    clock = {"s": 0.0, "n": 0}
    if "draft" in arms:  # the draft's own clock: every propose call, and what it proposed
        prop = arms["draft"].core.proposer
        plain = prop.propose

        def counted(requests):
            t = time.perf_counter()
            plain(requests)
            clock["s"] += time.perf_counter() - t
            clock["n"] += sum(len(r.spec_token_ids) for r in requests)

        prop.propose = counted
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    best: dict = {}  # (arm, workload, request) -> (least decode seconds, tokens, s a proposal)
    try:
        for a in arms.values():
            a.generate(prompts()["train"][:1], params)  # warm-up
        names = list(arms)
        for r in range(ROUNDS):
            for w in ("train", "norepeat"):
                for a in names[r % len(names):] + names[:r % len(names)]:
                    for i, p in enumerate(prompts()[w]):
                        clock.update(s=0.0, n=0)
                        o = arms[a].generate([p], params)[0]
                        secs = o.metrics.last_token_time - o.metrics.first_token_time
                        if secs < best.get((a, w, i), (float("inf"),))[0]:
                            best[a, w, i] = (secs, len(o.token_ids) - 1,
                                             clock["s"] / max(clock["n"], 1))
    finally:
        for a in arms.values():
            a.shutdown()
    tps = {}
    for a in arms:
        for w in ("train", "norepeat"):
            runs = [v for (a2, w2, _), v in best.items() if (a2, w2) == (a, w)]
            tps[a, w] = sum(t for _, t, _ in runs) / sum(s for s, _, _ in runs)
    c = None
    if "draft" in arms:  # seconds a proposal over seconds a target step, training passages
        per = [v[2] for (a, w, _), v in best.items() if (a, w) == ("draft", "train")]
        c = sum(per) / len(per) * tps["off", "train"]
    return {"tps": tps, "c": c}


def ratio(arm: str, w: str) -> float:
    t = timings()["tps"]
    return t[arm, w] / t["off", w]


def formula_miss() -> float:
    """How far the draft's measured speed-up on the training passages is from the formula's,
    at its exact acceptance rate and its timed ``c``: |measured / predicted - 1|."""
    predicted = predicted_speedup(figures("draft", "train")["rate"], K, timings()["c"])
    return abs(ratio("draft", "train") / predicted - 1)


# ------------------------------------------------------------------ recorded


NGRAM55, NGRAM25 = f"ngram k={K} min=5 max=5", f"ngram k={K} min=2 max=5"
ON = "recorded, shipped model, float32, 1 thread"
TW, HW = "the bench's training windows", "the bench's held-out windows"
RECORDED = {  # label -> how its stated text is read from bench spec's summarized report
    "recorded run: machine": lambda rep: _machine(rep),
    f"{ON}, {TW}, one request: n-gram (lookup 5 to 5) decode speed over off, "
    "mean acceptance length": lambda rep: _ng(rep, "copy", "copy-heavy-train", 1, NGRAM55),
    f"{ON}, {TW}, 8 requests at once: the same": lambda rep: _ng(
        rep, "copy", "copy-heavy-train", 8, NGRAM55),
    f"{ON}, {TW}, one request: n-gram (lookup 2 to 5), the same": lambda rep: _ng(
        rep, "copy", "copy-heavy-train", 1, NGRAM25),
    f"{ON}, {HW}, one request: n-gram (lookup 5 to 5), the same": lambda rep: _ng(
        rep, "copy", "copy-heavy-val", 1, NGRAM55),
    f"{ON}, no-repeat prompts, one request: n-gram (lookup 5 to 5), the same": lambda rep: _ng(
        rep, "norepeat", "no-repeat", 1, NGRAM55),
    f"{ON}, {TW}, one request: 1-layer draft: c, acceptance rate, predicted and "
    "measured speed-up": lambda rep: _draft(rep, "-L1"),
    f"{ON}, {TW}, one request: the target as its own draft: the same":
        lambda rep: _draft(rep, ""),
    "recorded, SmolLM2-135M shape (random weights, bf16), 1 thread: a verify step of 1 + 4 "
    "tokens in plain decode steps": lambda rep: _verify_cost(rep),
    "recorded, SmolLM2-135M shape, forced repeats, one request: n-gram (lookup 5 to 5) decode "
    "speed over off, predicted from the step cost": lambda rep: _shape(rep),
    f"{ON}, {TW}, one request: nanoserve's n-gram decode speed over vLLM's CPU "
    "build with the same speculative_config": lambda rep: _vllm(rep),
}


def _find(rep: dict, section: str, workload: str, batch: int, arm: str) -> dict | None:
    """The row of ``section`` for ``arm`` on ``workload`` at ``batch``, 1 thread."""
    for r in rep["rows"]:
        if (r["section"], r["workload"], r["batch"], r["arm"], r.get("threads")) == \
                (section, workload, batch, arm, 1):
            return r
    return None


def _status(r: dict | None) -> str | None:
    if r is None:
        return "not run"
    return None if r["status"] == "ok" and r.get("speedup_decode") else r["status"]


def _machine(rep: dict) -> str:
    hw = rep["hardware"]
    return f"{hw['cpu']}, {hw['cores']} cores, torch {hw['torch']}"


def _ng(rep, section, workload, batch, arm) -> str:
    r = _find(rep, section, workload, batch, arm)
    mal = r and r.get("mean_acceptance_length")  # None: nothing was proposed
    return _status(r) or f"{r['speedup_decode']:.2f}x, " + (f"{mal:.2f}" if mal else
                                                             "no proposals")


def _draft(rep, suffix: str) -> str:
    r = _find(rep, "draft", "copy-heavy-train", 1, f"draft k={K} nanoserve-tiny{suffix}")
    return _status(r) or (f"{r['c']:.2f}, {r['acceptance_rate']:.0%}, "
                          f"{r['predicted_speedup']:.2f}x, {r['speedup_decode']:.2f}x")


def _verify_cost(rep) -> str:
    c = next((c for c in rep.get("step_costs", []) if c.get("threads") == 1), None)
    if c is None:
        return "not run"
    return f"{(c['ratio'].get(str(K)) or c['ratio'].get(K)):.2f}"


def _shape(rep) -> str:
    r = next((r for r in rep["rows"] if r["section"] == "shape" and r["arm"] == NGRAM55
              and r.get("threads") == 1), None)
    return _status(r) or f"{r['speedup_decode']:.2f}x, {r['predicted_from_step_cost']:.2f}x"


def _vllm(rep) -> str:
    r = next((r for r in rep["rows"] if r["section"] == "vllm" and r["arm"] == NGRAM55), None)
    if r is None:
        return "not run"
    return f"{r['ratio_over_vllm']:.2f}x" if r.get("ratio_over_vllm") else r["status"]


def record(bench_json: Path, command: str = COMMAND, date: str | None = None) -> dict:
    """``bench spec``'s JSON with the fields a recorded claim needs, written to results/."""
    report = json.loads(Path(bench_json).read_text())
    hw = report["hardware"]
    out = {"machine": f"{hw['cpu']}, {hw['cores']} cores, no GPU",
           "date": date or datetime.date.today().isoformat(), "command": command,
           "values": {label: read(report) for label, read in RECORDED.items()}, **report}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / RESULTS).write_text(json.dumps(out, indent=1) + "\n")
    return out


CLAIMS = [
    *(exact(f"{NG}, {WORKLOADS[w]}: verify steps of decode steps, mean acceptance length, "
            f"tokens per target forward", lambda w=w: ngram_row(w)) for w in WORKLOADS),
    exact(f"{NG}, training passages: proposals kept at positions 1 to 4, of verify steps",
          lambda: positions("ngram", "train")),
    exact(f"{NG}, held-out passages: proposals kept at positions 1 to 4, of verify steps",
          lambda: positions("ngram", "val")),
    exact(f"{NG}, all {3 * REQUESTS} requests: accepted proposals, engine's counter and the "
          f"snapshot's replay over the outputs", replayed),
    exact(f"requests whose greedy tokens equal speculation off's, float32: {NG}",
          lambda: identical("ngram")),
    exact("prefixes of those requests' tokens where the package's propose_ngram and the "
          "snapshot's propose agree", live_lookup_agrees),
    exact("doctest examples of the snapshot that hold: lookup.py, speedup.py", doctests),
    *(exact(f"{DR}, {WORKLOADS[w]}: verify steps of decode steps, acceptance rate, mean "
            f"acceptance length", lambda w=w: draft_row(w), needs=draft_missing)
      for w in DRAFT_WORKLOADS),
    exact(f"requests whose greedy tokens equal speculation off's, float32: {DR}",
          lambda: identical("draft"), needs=draft_missing),
    exact(f"predicted speed-up, {DR} at its acceptance rate on training passages, c 1",
          lambda: f"{predicted_speedup(figures('draft', 'train')['rate'], K, 1.0):.2f}x",
          needs=draft_missing),
    exact(f"predicted speed-up, every proposal accepted, k {K}, c 1",
          lambda: f"{predicted_speedup(1.0, K, 1.0):.2f}x"),
    exact("weights a decode step reads, shipped model: 4 layers and head, first layer and "
          "head, the head alone", lambda: weights_row("shipped")),
    exact("weights a decode step reads, SmolLM2-135M shape: 30 layers and head, first layer "
          "and head, the head alone", lambda: weights_row("smollm2")),
    exact("c from weights read, first-layer draft over target: shipped model, SmolLM2-135M",
          lambda: f"{c_from_weights('shipped'):.2f}, {c_from_weights('smollm2'):.2f}"),
    exact(f"break-even acceptance rate, k {K}: SmolLM2-135M's first-layer draft, a draft with "
          f"c {SMALL_C}", lambda: f"{break_even_a(c_from_weights('smollm2'), K):.0%}, "
                                  f"{break_even_a(SMALL_C, K):.0%}"),
    timed(f"c measured, {DR}: seconds per proposal over seconds per target decode step, "
          "1 thread",
          lambda: timings()["c"], needs=draft_missing),
    timed(f"decode speed over off, training passages, one request, 1 thread: {NG}",
          lambda: ratio("ngram", "train")),
    timed(f"decode speed over off, no-repeat prompts, one request, 1 thread: {NG}",
          lambda: ratio("ngram", "norepeat")),
    timed(f"decode speed over off, training passages, one request, 1 thread: {DR}",
          lambda: ratio("draft", "train"), needs=draft_missing),
    timed(f"{DR}, training passages: measured speed-up against the formula's at its acceptance "
          "rate and measured c, relative difference", formula_miss, needs=draft_missing),
    *(recorded(label, RESULTS, label) for label in RECORDED),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="write results/spec-cpu.json from a bench spec "
                                            "JSON and print the table rows")
    p.add_argument("--record", required=True, help="bench spec's --out JSON")
    p.add_argument("--command", default=COMMAND)
    p.add_argument("--date", default=None)
    args = p.parse_args(argv)
    out = record(Path(args.record), args.command, args.date)
    for label, stated in out["values"].items():
        print(f"| {label} | {stated} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

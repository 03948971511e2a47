"""Day 76's numbers: what k proposals are worth, how the engine schedules, scores and rolls
them back, and what scoring 1 + k tokens costs against decoding one.

- **The formula** rows run the frozen snapshot (``snapshot/verify_cost.py``):
  ``expected_tokens(a, k)``, ``speedup(a, k, c)`` and ``best_k(a, c)``.
- **The scheduler** rows build a bare ``Scheduler`` over a ``KVCacheManager`` (block size 4,
  prefix caching on, a budget of 12 tokens), admit three requests of four-token prompts, give
  each its first token and then proposals by hand, and read what the next ``schedule()``
  plans: tokens per decode, and the blocks prefix caching commits for one of them.
- **The engine** rows load the shipped nanoserve-tiny in float32 with ``LLM``. One verify step
  is scored by hand on a row granted 64 tokens (``Engine.score``), with a forward pre-hook on
  the model counting its decode forwards and reading their positions, held against the
  snapshot's ``decode_forwards``. The rollback row drives the engine core: a request decodes
  its first token, is handed four proposals (two of them the tokens plain greedy decoding
  gives, two not), and one ``step()`` verifies them. The identity row generates a copy-heavy
  prompt (``copy_prompt``) greedily with and without n-gram speculation.
- **Timed** (``make chapter-76`` and the book build only): ``Engine.score`` of one row with
  1 + k tokens against ``Engine.decode`` of one token, the same row at 64 cached tokens, rolled
  back after every call (``truncate_row``), on one thread, the arms interleaved round by round
  and each arm's fastest call kept (``chapters.common.best_of``). Two models: the shipped one
  in float32, and a random Llama of eight SmolLM2-135M layers with a vocabulary of 8,192 in
  bf16 (Day 75's rerun shape), written by transformers.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from pathlib import Path

import torch

from chapters.common import SHIPPED, best_of, one_thread
from chapters.runner import exact, timed

from .snapshot.verify_cost import best_k, decode_forwards, expected_tokens, speedup

KS = (1, 2, 4, 7, 8)  # proposals per verify step, timed
BATCH = 8  # rows of the batched verify step (each with 4 proposals)
CACHED = 64  # tokens in the row before the verify step
PROMPT = ("The for statement is used to iterate over the elements of a sequence. The for "
          "statement is used to iterate over the elements of a list, and the for statement")
SMALL = "8 SmolLM2-135M layers, vocabulary 8,192, bf16"
TINY = "shipped model, float32"


# ------------------------------------------------------------------ the formula


def tokens_row(a: float) -> str:
    return ", ".join(f"{expected_tokens(a, k):.2f}" for k in (1, 2, 4, 8))


# ------------------------------------------------------------------ the scheduler


@functools.cache
def planned() -> dict:
    """Three requests decoding under a budget of 12: c (max_tokens 3) and a propose 4, b 8."""
    from nanoserve.engine.kv_manager import KVCacheManager
    from nanoserve.engine.request import Request
    from nanoserve.engine.scheduler import Scheduler

    s = Scheduler(KVCacheManager(32, 4, prefix_caching=True), 4, allocation="incremental",
                  max_num_batched_tokens=12)
    reqs = {"c": Request("c", [50, 51, 52, 53], max_tokens=3),
            "a": Request("a", [10, 11, 12, 13], max_tokens=16),
            "b": Request("b", [30, 31, 32, 33], max_tokens=16)}
    for r in reqs.values():  # c first: the oldest is planned first
        s.add(r)
    for r in s.schedule().sampled:  # one step: three prompts of 4, within the budget
        r.append_token(5)
    for name, k in (("c", 4), ("a", 4), ("b", 8)):
        reqs[name].spec_token_ids = list(range(100, 100 + k))
    out = s.schedule()
    s.check_invariants()
    a = reqs["a"]
    return {"tokens": {r.request_id: 1 + len(r.spec_token_ids) for r in out.decode},
            "batched": out.num_batched_tokens, "a_full": a.num_computed_tokens // 4,
            "a_committed": a.num_cached_blocks}


# ------------------------------------------------------------------ the shipped model


@functools.cache
def tiny_llm():
    from nanoserve.llm import LLM

    with one_thread():
        return LLM(SHIPPED, dtype="float32")


def prompt_ids(n: int | None = None) -> list[int]:
    ids = tiny_llm().tokenizer.encode(PROMPT, add_special_tokens=False)
    return ids[:n] if n else ids


class Positions:
    """A forward pre-hook on the model: the positions of every forward it sees."""

    def __init__(self, model):
        self.model, self.seen = model, []

    def _hook(self, module, args, kwargs):
        pos = args[1] if len(args) > 1 else kwargs["positions"]
        self.seen.append(pos.flatten().tolist())

    def __enter__(self) -> Positions:
        self._handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self._handle.remove()


@functools.cache
def verify_forwards(k: int, batch: int = 1) -> list[list[int]]:
    """The positions of each decode forward of one verify step: ``batch`` rows at 64 cached
    tokens, each scoring 1 + k tokens."""
    e, rows = tiny_llm().engine, list(range(batch))
    for r in rows:
        e.grant(r, CACHED + k + 1)
    try:
        with torch.inference_mode(), one_thread():
            e.prefill(rows, [list(range(5, 5 + CACHED))] * batch)
            with Positions(e.model) as p:
                e.score(rows, [[7] * (1 + k)] * batch, [1 + k] * batch)
    finally:
        for r in rows:
            e.release(r)
    return p.seen


def layer_loop_rows() -> int:
    """Rows the shipped model's decode layer loop takes in one call (0: the loop is off)."""
    weights = getattr(tiny_llm().engine.model, "decode_layer_weights", None)
    return weights["rows"] if weights and weights["rows"] else 0


def loop_of_eight() -> str | None:
    """``needs=``: the layout rows hold where the layer loop takes 8 rows, as the small-M
    kernel's measured choice gives on the machines this book ran on."""
    n = layer_loop_rows()
    return None if n == 8 else f"the decode layer loop takes {n or 'no'} rows here, not 8"


def forwards_row() -> str:
    return "; ".join(f"{len(f)} ({' + '.join(str(len(x)) for x in f)} entries)"
                     for f in (verify_forwards(4), verify_forwards(8), verify_forwards(4, BATCH)))


def span(xs: list[int]) -> str:
    return f"{xs[0]}-{xs[-1]}" if len(xs) > 1 else str(xs[0])


def positions_row() -> str:
    got = verify_forwards(8)
    want = [[p for _, p in f] for f in decode_forwards([(0, CACHED, 9)])]
    return ", ".join(span(f) for f in got) + ("; same" if got == want else f"; snapshot {want}")


@functools.cache
def rollback() -> dict:
    """One verify step through the engine core: a request of 13 prompt tokens decodes its
    first token, then is handed 4 proposals, the next two tokens of plain greedy decoding and
    two that are not; ``step()`` verifies them."""
    from nanoserve.sampling.params import SamplingParams

    llm, ids = tiny_llm(), prompt_ids(13)
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with one_thread():
        plain = llm.generate([ids], sp)[0].token_ids
        core = llm.core
        r = core.add_request("day76", ids, sp)
        while not r.output_token_ids:
            core.step()

        def state() -> str:
            return (f"{r.num_tokens}, {r.num_computed_tokens}, "
                    f"{core.engine.cache.lengths[r.slot]}, {len(r.blocks)}")

        before = state()
        wrong = (plain[3] + 1) % llm.model.cfg.vocab_size
        r.spec_token_ids = [plain[1], plain[2], wrong, wrong]
        core.step()
        after = state()
        emitted = list(r.output_token_ids)
        while core.has_unfinished():
            core.step()
    core.check_drained()
    return {"before": before, "after": after, "emitted": emitted, "plain": plain,
            "final": list(r.output_token_ids)}


def rollback_row() -> str:
    r = rollback()
    return f"{r['before']}; {r['after']}"


def rollback_tokens() -> str:
    r = rollback()
    agree = r["emitted"] == r["plain"][:len(r["emitted"])] and r["final"] == r["plain"]
    return f"{len(r['emitted']) - 1} tokens; {'same' if agree else 'different'}"


def copy_prompt() -> list[int]:
    """A copy-heavy prompt the shipped model saw in training: the first 80 tokens of pydoc's
    ``atom-literals`` topic, then its first 12 again, so the continuation repeats the text."""
    from pydoc_data.topics import topics

    ids = tiny_llm().tokenizer.encode(topics["atom-literals"].strip(), add_special_tokens=False)
    return ids[:80] + ids[:12]


@functools.cache
def identity() -> tuple[int, int, object]:
    """Greedy tokens before the first difference, n-gram speculation (k = 4) on and off, on the
    copy-heavy prompt; and the speculative run's counters."""
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
            "prompt_lookup_max": 5}
    with one_thread():
        off = tiny_llm().generate([copy_prompt()], sp)[0].token_ids
        llm = LLM(SHIPPED, dtype="float32", speculative_config=spec)
        on = llm.generate([copy_prompt()], sp)[0].token_ids
    pairs = zip(off, on, strict=False)  # unequal lengths are a difference too
    same = next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(off), len(on)))
    return same, len(off), llm.core.snapshot().spec_decode


def weight_bytes(folder: Path, dtype_bytes: int) -> int:
    """Bytes of weights one decode step reads, from config.json: every layer's linears and
    norms, the final norm and the head (vocabulary x hidden); the embedding reads one row."""
    c = json.loads((folder / "config.json").read_text())
    h, i, d = c["hidden_size"], c["intermediate_size"], c.get("head_dim") or \
        c["hidden_size"] // c["num_attention_heads"]
    attn = h * d * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    layer = attn + 3 * h * i + 2 * h
    return (c["num_hidden_layers"] * layer + h + c["vocab_size"] * h) * dtype_bytes


# ------------------------------------------------------------------ timed


@functools.cache
def small_folder() -> Path:
    """Day 75's rerun shape, bf16 only: eight SmolLM2-135M layers, a vocabulary of 8,192."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from nanoserve.bench.shapes import SMOLLM2_135M

    hf_logging.disable_progress_bar()
    root = Path(tempfile.mkdtemp(prefix="nanoserve-day76-")) / "bf16"
    cfg = {k: v for k, v in SMOLLM2_135M.items()
           if k not in ("architectures", "model_type", "torch_dtype")}
    cfg.update(num_hidden_layers=8, vocab_size=8192)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **cfg))
    model.to(torch.bfloat16).save_pretrained(root)
    return root


def verify_over_decode(engine, ks=KS, rounds: int = 100) -> dict:
    """Engine.score of 1 + k tokens over Engine.decode of one, one row at 64 cached tokens; and
    eight rows of 1 + 4 tokens each over an eight-row decode. Every call is rolled back; each
    arm keeps its fastest of ``rounds`` interleaved calls."""
    rows = list(range(BATCH))
    for r in rows:
        engine.grant(r, CACHED + max(ks) + 1)
    try:
        with torch.inference_mode(), one_thread():
            engine.prefill(rows, [list(range(5 + r, 5 + r + CACHED)) for r in rows])

            def arm(batch: int, k: int | None):
                def once() -> float:
                    t = time.perf_counter()
                    if k is None:
                        engine.decode(rows[:batch], [7] * batch)
                    else:
                        engine.score(rows[:batch], [[7] * (1 + k)] * batch, [1 + k] * batch)
                    dt = time.perf_counter() - t
                    for r in rows[:batch]:
                        engine.cache.truncate_row(r, CACHED)
                    return dt
                return once

            runs = {(1, None): arm(1, None), (BATCH, None): arm(BATCH, None),
                    (BATCH, 4): arm(BATCH, 4), **{(1, k): arm(1, k) for k in ks}}
            for fn in runs.values():
                fn()  # warm-up
            best = best_of(rounds, runs, lambda t: t)
    finally:
        for r in rows:
            engine.release(r)
    out = {k: best[1, k] / best[1, None] for k in ks}
    out["batch"] = best[BATCH, 4] / best[BATCH, None]
    return out


@functools.cache
def tiny_ratios() -> dict[int, float]:
    return verify_over_decode(tiny_llm().engine, rounds=200)


@functools.cache
def small_ratios() -> dict[int, float]:
    from nanoserve.llm import LLM

    with one_thread():
        llm = LLM(str(small_folder()), dtype="bfloat16", skip_tokenizer_init=True)
    try:
        return verify_over_decode(llm.engine, rounds=60)
    finally:
        llm.shutdown()


def _timed(where: str, ratios, k: int):
    return timed(f"Engine.score of 1 + k tokens over Engine.decode of one, {where}, one row at "
                 f"64 tokens, 1 thread: k = {k}", lambda: ratios()[k], fmt="{:.2f}x".format)


CLAIMS = [
    exact("expected tokens per verify step, acceptance rate 0.6: k = 1, 2, 4, 8",
          lambda: tokens_row(0.6)),
    exact("expected tokens per verify step, acceptance rate 0.9: k = 1, 2, 4, 8",
          lambda: tokens_row(0.9)),
    exact("speed-up by the formula, acceptance rate 0.8, k = 4: n-gram (c = 0), a draft at "
          "c = 0.1", lambda: f"{speedup(0.8, 4, 0.0):.2f}x, {speedup(0.8, 4, 0.1):.2f}x"),
    exact("k with the largest speed-up, acceptance rate 0.8, c = 0.1, k from 1 to 16",
          lambda: f"{best_k(0.8, 0.1)} ({speedup(0.8, best_k(0.8, 0.1), 0.1):.2f}x)"),
    exact("tokens planned per decode, budget 12, requests in age order: c (max_tokens 3, 1 "
          "token out, 4 proposals), a (4 proposals), b (8 proposals)",
          lambda: ", ".join(str(planned()["tokens"][n]) for n in "cab")),
    exact("request a (5 tokens, 4 proposals, block size 4): full blocks its step computes, "
          "blocks prefix caching commits",
          lambda: f"{planned()['a_full']}, {planned()['a_committed']}"),
    exact(f"bytes of weights one decode step reads, {TINY}",
          lambda: f"{weight_bytes(SHIPPED, 4) / 1e6:.1f} MB"),
    exact(f"decode forwards of one verify step, {TINY}, rows at 64 tokens: one row, k = 4; one "
          f"row, k = 8; eight rows, k = 4", forwards_row),
    exact(f"positions each decode forward writes, one row, k = 8, {TINY}; against the "
          f"snapshot's decode_forwards", positions_row),
    exact(f"a verify step accepting 2 of 4 proposals, {TINY}, 13 prompt tokens, block size 16: "
          f"tokens, num_computed_tokens, row length, blocks held; before; after", rollback_row),
    exact("tokens that step emitted, and against plain greedy decoding", rollback_tokens),
    exact(f"greedy tokens identical with n-gram speculation (k = 4) on and off, {TINY}, the "
          f"copy-heavy prompt", lambda: "{} of {}".format(*identity()[:2])),
    *[_timed(TINY, tiny_ratios, k) for k in KS],
    *[_timed(SMALL, small_ratios, k) for k in KS],
    timed(f"Engine.score of eight rows of 1 + 4 tokens over Engine.decode of eight rows, {TINY}, "
          f"rows at 64 tokens, 1 thread, where the decode layer loop takes 8 rows",
          lambda: tiny_ratios()["batch"], fmt="{:.2f}x".format, needs=loop_of_eight),
]

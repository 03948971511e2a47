"""Speculative decoding is lossless and composes (issue 41, Days 76-78).

The claim under test: greedy outputs in float32 are the same with speculation on and off, for
every k from 1 to 8, whatever else the engine is doing: preemption (a pool too small for the
batch), prefix caching, chunked prefill (a budget that cuts prompts, and proposals, short),
prefill and decode in two forwards, the persistent batch's compaction and recorded decode
windows (eager replay here, no CUDA), each attention backend, blocks given back behind a
sliding window, aborts, stop strings and stop token ids inside an accepted run, ``max_tokens``
and ``max_model_len`` at the edge, logprobs, and two tensor-parallel ranks (slow tier). Every
run is compared with the same configuration with speculation off: token ids, text, finish
reason, stop reason and the logprobs' tokens and ranks (their values within 1e-4).

The proposers: the n-gram proposer (prompt lookup) on prompts that repeat themselves (a passage
of the model's own training text, then its opening again, so the continuation is in the
prompt); the draft model (the shipped model's first two layers) where it is built; and
``OracleProposer``, test-only, which proposes the speculation-off run's own continuation with
tokens corrupted at random positions, so verify steps have both accepted and rejected
proposals, as many as k, at every position: the rollback is exercised on purpose.

Between steps the driver checks what must hold at every moment: the scheduler's invariants,
each running request's cache row exactly as long as its computed tokens (a verify step's
rejected positions are forgotten), nothing past ``max_tokens`` or ``max_model_len``, a logprob
for every emitted token, and no block registered by prefix caching past a request's real
tokens (a separate test compares the registered blocks' K/V with a fresh prefill's). After
every drain every block is back in the pool, and the proposer was handed every request that
left the batch (``Proposer.release``).

The engines of one test share one loaded model (building an engine is cheap; loading the
weights is not), so the hypothesis runs stay in seconds.
"""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nanoserve import LLM, SamplingParams
from nanoserve.config import DEFAULT_MODEL, EngineConfig
from nanoserve.config.speculative import SpeculativeConfig
from nanoserve.engine.core import EngineCore
from nanoserve.engine.engine import Engine
from nanoserve.engine.prefix_cache import block_hashes
from nanoserve.loader import default_num_kv_blocks
from nanoserve.model.text_loss import corpus
from nanoserve.spec_decode.proposer import Proposer, proposer_class

try:  # the draft-model proposer (Day 77), where it is built
    from nanoserve.spec_decode.draft import write_truncated_draft
except ImportError:
    write_truncated_draft = None

# who proposes in the property test: the oracle twice as often (it always rejects some)
METHODS = ["oracle", "ngram", "oracle"] + (["draft_model"] if write_truncated_draft else [])
PROMPT_LIMIT = 1024  # nanoserve-tiny's max_position_embeddings: max_model_len by default
PASSAGES = [d for d in corpus()[0] if len(d) > 400][:16]  # training text: the model continues it


# ---------------------------------------------------------------------------- the engines


@pytest.fixture(scope="module")
def loaded():
    """The shipped model, loaded once in float32; every engine below is built over it."""
    llm = LLM(dtype="float32", max_num_seqs=1)
    return llm.core.loaded


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> str | None:
    """A cheap draft of the shipped model, its first two layers (None where no draft-model
    proposer is built)."""
    if write_truncated_draft is None:
        return None
    return str(write_truncated_draft(DEFAULT_MODEL, tmp_path_factory.mktemp("draft") / "d", 2))


def attentions(loaded) -> list[str]:
    """The read paths this machine has: the C++ kernel's only where the ops built."""
    return ["gathered", "reference"] + (["cpu"] if loaded.kernels else [])


def make_core(loaded, proposer: Proposer | str | None = None, k: int = 4,
              attention: str = "gathered", draft: str | None = None, **options) -> EngineCore:
    """A core over the shared model, configured as ``EngineConfig(**options)`` would load it
    (same checks, same pool rule); ``proposer``: "ngram" or "draft_model" (the registry's, the
    latter with ``draft`` as its model), a ``Proposer``, or None (speculation off)."""
    spec = None
    lookup = {"prompt_lookup_min": options.pop("prompt_lookup_min", 2),
              "prompt_lookup_max": options.pop("prompt_lookup_max", 4)}
    if proposer == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": k, **lookup}
    elif proposer == "draft_model":
        spec = {"method": "draft_model", "num_speculative_tokens": k, "model": draft}
    cfg = EngineConfig(dtype="float32", attention=attention, speculative_config=spec, **options)
    mc, model = loaded.model_config, loaded.model
    max_model_len = cfg.resolve_max_model_len(mc.max_position_embeddings)
    blocks = cfg.num_kv_blocks or default_num_kv_blocks(mc, cfg.max_num_seqs, max_model_len,
                                                        cfg.block_size, 4)
    engine = Engine(model, num_kv_blocks=blocks, block_size=cfg.block_size,
                    max_num_seqs=cfg.max_num_seqs, max_model_len=max_model_len,
                    prefill=cfg.prefill, attention=attention, cuda_graphs=cfg.cuda_graphs)
    here = dataclasses.replace(loaded, config=cfg, engine=engine, max_model_len=max_model_len,
                               attention=attention)
    if spec is not None:
        proposer = proposer_class(spec["method"]).create(cfg.speculative_config, here)
    core = EngineCore(engine, cfg, loaded.tokenizer, loaded.eos_token_ids, max_model_len,
                      mc.vocab_size, proposer)
    core.loaded = here
    return core


class OracleProposer(Proposer):
    """Test-only: proposes what the speculation-off run emitted next (``reference``: request id
    -> its tokens), ``k`` tokens, each replaced by another token with probability ``wrong``
    (and random tokens past the reference's end). It records who it was told about, to check
    that the core releases every request that leaves the batch."""

    def __init__(self, k: int, reference: dict[str, list[int]], seed: int = 0,
                 wrong: float = 0.3, vocab: int = 2048, exact_k: bool = False):
        super().__init__(SpeculativeConfig.parse({"method": "ngram",
                                                  "num_speculative_tokens": k}))
        self.reference, self.rng, self.wrong, self.vocab = reference, random.Random(seed), \
            wrong, vocab
        self.exact_k = exact_k
        self.live: set[str] = set()  # proposed for, not yet released
        self.released: list[str] = []

    def propose(self, requests) -> None:
        rng = self.rng
        for r in requests:
            self.live.add(r.request_id)
            ref, n = self.reference[r.request_id], len(r.output_token_ids)
            want = self.k if self.exact_k else rng.randint(0, self.k)
            toks = list(ref[n:n + want])
            toks += [rng.randrange(2, self.vocab) for _ in range(want - len(toks))]
            for i, t in enumerate(toks):
                if rng.random() < self.wrong:
                    toks[i] = (t + rng.randrange(1, self.vocab)) % self.vocab
            r.spec_token_ids, r.spec_draft_probs = toks, None

    def release(self, request) -> None:
        self.live.discard(request.request_id)
        self.released.append(request.request_id)


# ---------------------------------------------------------------------------- the driver


@dataclasses.dataclass
class Result:
    token_ids: list[int]
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (token, rank)
    logprob_values: list[float] = dataclasses.field(default_factory=list)

    def same(self) -> tuple:
        return (self.token_ids, self.text, self.finish_reason, self.stop_reason, self.logprobs)


def check_between_steps(core: EngineCore) -> None:
    """What holds after every step, speculation or not."""
    core.check_invariants()
    cache, kv = core.engine.cache, core.scheduler.kv_cache_manager
    bs = kv.block_size
    pool = kv.pool
    for r in core.scheduler.running:
        assert len(r.output_token_ids) <= r.max_tokens, r
        assert r.num_tokens <= core.max_model_len, r
        if r.params.logprobs is not None:
            assert len(r.logprobs) == len(r.output_token_ids), "an emitted token lacks logprobs"
        # the blocks it registered hold its real tokens only (never a proposal)
        assert r.num_cached_blocks * bs <= r.num_tokens, r
        for i in range(r.num_cached_blocks):
            b = r.blocks[i]
            if getattr(pool, "_hash_of", {}).get(b) is not None:
                assert pool._tokens_of[b] == tuple(r.token_ids[i * bs:(i + 1) * bs])
        if r.is_finished:
            continue
        # the row holds exactly the computed tokens: a verify step forgot its rejections
        assert cache.lengths[r.slot] == r.num_computed_tokens <= r.num_tokens, (
            r, cache.lengths[r.slot], r.num_computed_tokens)
        assert len(cache.tables[r.slot]) <= len(r.blocks)
        assert cache.lengths[r.slot] <= core.max_model_len


def drive(core: EngineCore, requests: list[tuple[str, list[int], SamplingParams]],
          after=None, max_steps: int = 2000) -> dict[str, Result]:
    """Add every request, step until drained (``after(core, step)`` runs after each step: a
    test's aborts), checking between steps; then the drain check. Returns each request's
    concatenated news."""
    out = {rid: Result([]) for rid, _, _ in requests}
    with torch.inference_mode():
        for rid, ids, sp in requests:
            core.add_request(rid, ids, sp)
        steps = 0
        while core.has_unfinished():
            steps += 1
            assert steps <= max_steps, "the core stopped making progress"
            for d in core.step():
                res = out[d.request_id]
                res.token_ids += d.new_token_ids
                res.text += d.new_text
                res.logprobs += [(e.token_id, e.rank) for e in d.new_logprobs]
                res.logprob_values += [e.logprob for e in d.new_logprobs]
                if d.finished:
                    res.finish_reason, res.stop_reason = d.finish_reason, d.stop_reason
            check_between_steps(core)
            if after is not None:
                after(core, steps)
                check_between_steps(core)
    core.check_drained()
    if isinstance(core.proposer, OracleProposer):
        assert not core.proposer.live, f"never released: {core.proposer.live}"
    return out


def prompt_ids(loaded, passage: int, start: int, length: int, again: int) -> list[int]:
    """A passage of training text, then its opening again: the continuation is in the prompt."""
    text = PASSAGES[passage % len(PASSAGES)][start:start + length]
    return loaded.tokenizer.encode(text + text[:again])


def assert_same(on: dict[str, Result], off: dict[str, Result]) -> None:
    for rid in off:
        assert on[rid].same() == off[rid].same(), rid
        assert on[rid].logprob_values == pytest.approx(off[rid].logprob_values, abs=1e-4)


# ---------------------------------------------------------------------------- the property


@st.composite
def scenarios(draw):
    """One configuration, its prompts and their parameters, within the engine's legal space."""
    n = draw(st.sampled_from([1, 2, 3, 3]))
    prompts = [(draw(st.integers(0, 15)), draw(st.integers(0, 200)), draw(st.integers(20, 160)),
                draw(st.integers(10, 50))) for _ in range(n)]
    max_tokens = draw(st.one_of(st.integers(16, 48), st.integers(1, 4)))
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    seqs = draw(st.integers(1, 4))
    chunked = draw(st.booleans())
    budget = draw(st.one_of(st.none(), st.integers(seqs, 24)))
    cuda_graphs = draw(st.booleans())
    options = dict(
        block_size=block_size, max_num_seqs=seqs, enable_chunked_prefill=chunked,
        max_num_batched_tokens=budget, enable_prefix_caching=draw(st.booleans()),
        cuda_graphs=cuda_graphs,
        compact_rows=draw(st.sampled_from([None, True, False])) if not cuda_graphs else None,
        prefill=draw(st.sampled_from(["packed", "padded"])),
        prompt_lookup_min=draw(st.integers(1, 2)), prompt_lookup_max=draw(st.integers(2, 5)))
    params = dict(
        max_tokens=max_tokens, ignore_eos=draw(st.booleans()),
        stop=draw(st.sampled_from([None, None, ["\n\n"], [" the"], ["()", ". "], ["e "]])),
        logprobs=draw(st.sampled_from([None, 0, 2])))
    return dict(k=draw(st.integers(1, 8)),
                method=draw(st.sampled_from(METHODS)),
                prompts=prompts, options=options, params=params,
                small_pool=draw(st.sampled_from([False, True, True])),
                short_context=draw(st.booleans()),
                stop_token=draw(st.one_of(st.none(), st.integers(0, 60))),
                attention=draw(st.integers(0, 2)), wrong=draw(st.sampled_from([0.0, 0.2, 0.6])),
                seed=draw(st.integers(0, 2**16)))


def check_scenario(loaded, s: dict, draft: str | None) -> None:
    opts, ps = dict(s["options"]), dict(s["params"])
    ids = [prompt_ids(loaded, *p) for p in s["prompts"]]
    longest, bs = max(len(i) for i in ids), opts["block_size"]
    if s["short_context"]:  # max_model_len within the output: it ends some requests early
        opts["max_model_len"] = longest + 1 + ps["max_tokens"] // 2
    if s["stop_token"] is not None:  # a token the continuation is likely to repeat
        ps["stop_token_ids"] = [ids[0][s["stop_token"] % len(ids[0])]]
    worst = longest + ps["max_tokens"]
    if not opts["enable_chunked_prefill"] and opts["max_num_batched_tokens"] is not None:
        opts["max_num_batched_tokens"] = max(opts["max_num_batched_tokens"],  # config's rule
                                             opts.get("max_model_len", PROMPT_LIMIT))
    if s["small_pool"]:  # room for one request at its worst: a batch of them preempts
        opts["num_kv_blocks"] = -(-worst // bs) + 1
    sp = SamplingParams(temperature=0, **ps)
    reqs = [(str(i), p, sp) for i, p in enumerate(ids)]
    choices = attentions(loaded)
    att = choices[s["attention"] % len(choices)]
    off = drive(make_core(loaded, None, attention=att, **opts), reqs)
    if s["method"] in ("ngram", "draft_model"):
        proposer = s["method"]
    else:
        proposer = OracleProposer(s["k"], {r: o.token_ids for r, o in off.items()}, s["seed"],
                                  s["wrong"], loaded.model_config.vocab_size)
    core = make_core(loaded, proposer, k=s["k"], attention=att, draft=draft, **opts)
    on = drive(core, reqs)
    assert_same(on, off)
    stats, snap = core.engine.spec_stats, core.snapshot()  # what the example exercised
    verdict = ("none" if not stats.num_drafts else "all accepted"
               if stats.acceptance_rate == 1 else "some rejected")
    event(f"proposals: {verdict}")
    event(f"method: {s['method']}")
    event(f"preempted: {snap.num_preemptions > 0}")
    event(f"chunked: {any(len(i) > core.scheduler.max_num_batched_tokens for i in ids)}")
    event(f"replayed windows: {snap.decode_steps_replayed > 0}")
    for o in on.values():
        event(f"finish: {o.finish_reason}")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=scenarios())
def test_greedy_identity_with_speculation_on_and_off(loaded, draft, s):
    check_scenario(loaded, s, draft)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=scenarios())
def test_greedy_identity_with_speculation_on_and_off_at_length(loaded, draft, s):
    check_scenario(loaded, s, draft)


# ---------------------------------------------------------------------------- every k, named


def repetitive(loaded, n: int = 3) -> list[list[int]]:
    return [prompt_ids(loaded, i, 0, 160, 60) for i in range(n)]


@pytest.mark.parametrize("k", range(1, 9))
def test_every_k_accepts_and_rejects_and_changes_nothing(loaded, draft, k):
    """Each k from 1 to 8, every method (n-gram, the draft model where it is built, and the
    oracle), under preemption (a pool for one request at its worst and two blocks), prefix
    caching and a chunking budget: identical, and the oracle's steps saw accepted and rejected
    proposals at position k."""
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    ids = repetitive(loaded)
    worst = max(map(len, ids)) + 24
    opts = dict(block_size=4, max_num_seqs=3, num_kv_blocks=-(-worst // 4) + 2,
                enable_prefix_caching=True, max_num_batched_tokens=3 + 2 * k)
    reqs = [(str(i), p, sp) for i, p in enumerate(ids)]
    off_core = make_core(loaded, None, **opts)
    off = drive(off_core, reqs)
    assert off_core.scheduler.preemptions > 0  # the case is exercised, not assumed
    ngram = make_core(loaded, "ngram", k=k, prompt_lookup_min=1, **opts)
    assert_same(drive(ngram, reqs), off)
    assert ngram.engine.spec_stats.num_accepted_tokens > 0
    if draft is not None:
        drafted = make_core(loaded, "draft_model", k=k, draft=draft, **opts)
        assert_same(drive(drafted, reqs), off)
        assert drafted.engine.spec_stats.num_drafts > 0
    oracle = OracleProposer(k, {r: o.token_ids for r, o in off.items()}, seed=k, wrong=0.15,
                            exact_k=True)
    core = make_core(loaded, oracle, **dict(opts, max_num_batched_tokens=3 * (k + 1)))
    assert_same(drive(core, reqs), off)
    stats = core.engine.spec_stats
    assert len(stats.accepted_per_pos) == k and stats.accepted_per_pos[-1] > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # some were rejected
    assert sorted(set(oracle.released)) == ["0", "1", "2"]


@pytest.mark.parametrize("attention", ["gathered", "cpu", "reference"])
def test_graph_windows_and_compaction_compose_with_rollback(loaded, attention):
    """Recorded decode windows (eager replay) and the persistent batch: rows finish at
    different times, so compaction moves rows whose last verify step was rolled back, and the
    oracle proposes nothing on some steps, so plain decode steps replay a window right after
    a truncation. Same text, and each path was taken."""
    if attention not in attentions(loaded):
        pytest.skip("the C++ ops are not built here")
    ids = repetitive(loaded, 4)
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (9, 30, 17, 26)]
    reqs = [(str(i), p, sp) for i, (p, sp) in enumerate(zip(ids, sps, strict=True))]
    opts = dict(cuda_graphs=True, max_num_seqs=4, block_size=8, attention=attention)
    off = drive(make_core(loaded, None, **opts), reqs)
    oracle = OracleProposer(6, {r: o.token_ids for r, o in off.items()}, seed=5, wrong=0.3)
    core = make_core(loaded, oracle, **opts)
    assert_same(drive(core, reqs), off)
    snap = core.snapshot()
    assert snap.decode_steps_replayed > 0 and core.scheduler.compactor.moves > 0
    assert 0 < core.engine.spec_stats.num_accepted_tokens < core.engine.spec_stats.num_draft_tokens


@pytest.mark.parametrize("options", [
    dict(max_num_batched_tokens=8, max_num_seqs=4),  # chunked
    dict(num_kv_blocks=13, max_num_seqs=4, max_num_batched_tokens=8),  # preempts
    dict(compact_rows=True, max_num_seqs=4, enable_prefix_caching=True),
])
def test_blocks_behind_a_sliding_window_compose_with_rollback(hf_checkpoint, options):
    """Every layer windowed (a random Mistral, 12 tokens, blocks of 4, Day 70): blocks behind
    the window go back to the pool while a request speculates 6 tokens ahead and rolls back;
    the text is the same as without speculation, blocks were given back, the null block was
    never written, and every block is back after the drain."""
    from nanoserve.engine.kv_manager import NULL_BLOCK

    ckpt = hf_checkpoint("gqa", family="mistral", sliding_window=12)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 255, (n,), generator=g).tolist() for n in (5, 21, 13, 30)]
    sps = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (24, 10, 24, 16)]
    llm = LLM(str(ckpt), dtype="float32", skip_tokenizer_init=True, kernels=False, block_size=4,
              **options)
    off = llm.generate(prompts, sps)
    ref = {str(i + len(prompts)): o.token_ids for i, o in enumerate(off)}  # the next ids
    llm.core.proposer = OracleProposer(6, ref, seed=2, wrong=0.3, vocab=255)
    freed = llm.core.scheduler.kv_cache_manager.window_freed
    on = llm.generate(prompts, sps)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    stats = llm.engine.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert llm.core.scheduler.kv_cache_manager.window_freed > freed
    assert not llm.core.proposer.live
    cache, null = llm.engine.cache, slice(NULL_BLOCK * 4, (NULL_BLOCK + 1) * 4)
    assert not cache.k[:, null].any() and not cache.v[:, null].any()


# ---------------------------------------------------------------------------- the edges


def exact_oracle(loaded, ids, sp, k=8, **opts):
    """The speculation-off outputs and a core whose proposer proposes them, uncorrupted."""
    reqs = [(str(i), p, sp) for i, p in enumerate(ids)]
    off = drive(make_core(loaded, None, **opts), reqs)
    oracle = OracleProposer(k, {r: o.token_ids for r, o in off.items()}, wrong=0.0,
                            exact_k=True)
    return reqs, off, make_core(loaded, oracle, **opts)


def free_run(loaded, ids: list[int], n: int = 30) -> Result:
    """What the model says after ``ids`` with no stop rule, speculation off."""
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return drive(make_core(loaded, None), [("0", ids, sp)])["0"]


def verified_but_not_emitted(core: EngineCore, emitted: int) -> int:
    """Tokens that verify steps accepted (or added) that the request never emitted: more than
    zero means a stop rule ended it inside an accepted run. The prefill emitted one."""
    stats = core.engine.spec_stats
    return stats.num_accepted_tokens + stats.num_drafts - (emitted - 1)


def test_a_stop_token_inside_the_accepted_run_ends_the_request_there(loaded):
    ids = repetitive(loaded, 1)
    free = free_run(loaded, ids[0]).token_ids
    stop = free[13]
    first = free.index(stop)
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop],
                        logprobs=0)
    reqs, off, core = exact_oracle(loaded, ids, sp)
    on = drive(core, reqs)
    assert_same(on, off)
    assert on["0"].token_ids == free[:first + 1] and on["0"].finish_reason == "stop"
    assert on["0"].stop_reason == stop and len(on["0"].logprobs) == first + 1
    assert verified_but_not_emitted(core, first + 1) > 0


def test_a_stop_string_inside_the_accepted_run_ends_the_request_there(loaded):
    ids = repetitive(loaded, 1)
    free = free_run(loaded, ids[0])
    stop = free.text[20:23]
    cut = free.text.index(stop)
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    reqs, off, core = exact_oracle(loaded, ids, sp)
    on = drive(core, reqs)
    assert_same(on, off)
    assert on["0"].finish_reason == "stop" and on["0"].stop_reason == stop
    assert on["0"].text == free.text[:cut]
    assert on["0"].token_ids == free.token_ids[:len(on["0"].token_ids)]
    assert verified_but_not_emitted(core, len(on["0"].token_ids)) > 0


@pytest.mark.parametrize("limit", ["max_tokens", "max_model_len"])
def test_max_tokens_and_max_model_len_are_never_exceeded(loaded, limit):
    """k = 8 correct proposals every step: 1 token from the prefill, 9 from the first verify
    step, then the next step's proposals are cut to 3, so that a request with room for 14
    tokens ends exactly there, never one past it (the driver checks every step)."""
    ids = repetitive(loaded, 1)
    if limit == "max_tokens":
        sp, opts = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True), {}
    else:
        sp = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
        opts = dict(max_model_len=len(ids[0]) + 14, block_size=4)
    reqs, off, core = exact_oracle(loaded, ids, sp, **opts)
    on = drive(core, reqs)
    assert_same(on, off)
    assert len(on["0"].token_ids) == 14 and on["0"].finish_reason == "length"
    stats = core.engine.spec_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 11, 11)


# ---------------------------------------------------------------------------- abort and drain


@pytest.mark.parametrize("proposer", ["ngram", "oracle"])
def test_abort_mid_run_with_speculation_on_then_drain(loaded, proposer):
    """Abort a request that is still waiting (max_num_seqs=2), then one whose proposals wait
    for the next verify step, at the first step it has some; the survivor finishes as it would
    alone with speculation off, and after the drain every block and row is back."""
    ids = repetitive(loaded, 4)
    sp = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=0)
    opts = dict(block_size=4, max_num_seqs=2, enable_prefix_caching=True)
    solo = {str(i): drive(make_core(loaded, None, **opts), [(str(i), ids[i], sp)])[str(i)]
            for i in (0, 1)}
    if proposer == "ngram":
        core = make_core(loaded, "ngram", k=5, prompt_lookup_min=1, **opts)
    else:
        core = make_core(loaded, OracleProposer(5, {r: o.token_ids for r, o in solo.items()},
                                                wrong=0.3), **opts)
    pending = []

    def abort(core, step):
        if step == 1:
            assert core.abort_request("3")  # waiting: never admitted
        t = core.requests.get("0")
        if t is not None and not t.request.is_finished and t.request.spec_token_ids:
            pending.append(list(t.request.spec_token_ids))
            assert core.abort_request("0")
            assert core.abort_request("2")  # waiting, or just admitted in 0's place

    out = drive(core, [(str(i), p, sp) for i, p in enumerate(ids)], after=abort)
    assert pending, "request 0 never had proposals pending"
    assert out["0"].finish_reason == out["2"].finish_reason == out["3"].finish_reason == "abort"
    assert out["1"].same() == solo["1"].same()
    assert len(out["0"].token_ids) < 20
    snap = core.snapshot()
    assert snap.num_free_blocks == snap.num_blocks and snap.by_reason["abort"] == 3


def test_the_core_releases_every_request_from_the_proposer(loaded):
    """Finished, preempted and aborted requests are each handed to ``Proposer.release`` (a
    draft model keeps per-request state: its KV); none is left live after the drain."""
    ids = repetitive(loaded, 3)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    worst = max(map(len, ids)) + 24
    opts = dict(block_size=4, max_num_seqs=3, num_kv_blocks=-(-worst // 4) + 2,
                max_num_batched_tokens=16)
    off = drive(make_core(loaded, None, **opts), [(str(i), p, sp) for i, p in enumerate(ids)])
    oracle = OracleProposer(4, {r: o.token_ids for r, o in off.items()})
    core = make_core(loaded, oracle, **opts)

    def abort(core, step):
        if step == 12:
            core.abort_request("2")

    drive(core, [(str(i), p, sp) for i, p in enumerate(ids)], after=abort)
    assert core.scheduler.preemptions > 0
    assert "2" in oracle.released and not oracle.live
    assert len(oracle.released) >= 3 + core.scheduler.preemptions - 1


# ---------------------------------------------------------------------------- prefix caching


def fresh_kv(loaded, tokens: list[int], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V of ``tokens`` computed by one plain prefill: (L, n, Hkv, D) each."""
    e = Engine(loaded.model, num_kv_blocks=-(-len(tokens) // block_size) + 1,
               block_size=block_size, max_num_seqs=1, max_model_len=len(tokens) + 1)
    with torch.inference_mode():
        e.grant(0, len(tokens))
        e.prefill([0], [tokens])
    cells = e.cache.tables[0].cells(0, len(tokens))
    return e.cache.k[:, cells].clone(), e.cache.v[:, cells].clone()


def test_prefix_caching_never_commits_a_block_with_unverified_tokens(loaded):
    """A request decodes through verify steps full of rejections, with blocks of 4 tokens, so
    most decode blocks fill while rejected proposals sit in them. Every block the prefix cache
    registered holds the K/V of the request's real tokens (compared with a fresh prefill of
    them); and a second request whose prompt is the first's whole sequence hits those blocks and
    says what it says without speculation and without caching."""
    bs = 4
    ids = repetitive(loaded, 1)[0]
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    off = drive(make_core(loaded, None, block_size=bs), [("a", ids, sp)])
    oracle = OracleProposer(8, {"a": off["a"].token_ids}, seed=3, wrong=0.25, exact_k=True)
    core = make_core(loaded, oracle, block_size=bs, enable_prefix_caching=True)
    on = drive(core, [("a", ids, sp)])
    assert on["a"].same() == off["a"].same()
    stats = core.engine.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    seq = ids + on["a"].token_ids
    pool = core.scheduler.kv_cache_manager.pool
    where = {h: i for i, h in enumerate(block_hashes(seq, bs))}
    registered = {b: where.get(h) for b, h in pool._hash_of.items()}
    assert None not in registered.values(), "a registered block is not a run of real tokens"
    decoded = [i for i in registered.values() if i * bs >= len(ids)]
    assert len(decoded) >= 5, "too few blocks filled by verify steps to say anything"
    k_ref, v_ref = fresh_kv(loaded, seq, bs)
    for b, i in registered.items():
        got_k = core.engine.cache.k[:, b * bs:(b + 1) * bs]
        got_v = core.engine.cache.v[:, b * bs:(b + 1) * bs]
        torch.testing.assert_close(got_k, k_ref[:, i * bs:(i + 1) * bs], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got_v, v_ref[:, i * bs:(i + 1) * bs], atol=1e-4, rtol=1e-4)
    # the second request: the whole first sequence as its prompt, found in the cache
    oracle.reference["b"] = []
    sp2 = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    hits = core.snapshot().prefix_cache_hits
    second = drive(core, [("b", seq, sp2)])
    assert core.snapshot().prefix_cache_hits - hits >= len(decoded) * bs
    plain = drive(make_core(loaded, None, block_size=bs), [("b", seq, sp2)])
    assert second["b"].same() == plain["b"].same()


# ---------------------------------------------------------------------------- tensor parallelism


def test_a_score_message_carries_each_rows_want():
    """Under ``-tp 2`` the logits are gathered across the ranks, and a gather needs one shape on
    every rank: a worker must read the same ``want`` as rank 0 (it read [1] * B once, and gloo
    gathered mismatched shapes without a word: wrong tokens with speculation on)."""
    from nanoserve.tp import protocol

    m = protocol.Message(protocol.SCORE, [2, 0], [[5, 6, 7], [9]], frozenset(), [6, 2, 4], [3, 1])
    assert protocol.decode(protocol.encode(m)) == m
    plain = protocol.Message(protocol.DECODE, [1], [[4]], frozenset(), [])
    assert protocol.decode(protocol.encode(plain)) == plain
    with pytest.raises(ValueError, match="one count per row"):
        protocol.encode(protocol.Message(protocol.SCORE, [0, 1], [[1], [2]], frozenset(), []))


# ---------------------------------------------------------------------------- the front door


@pytest.mark.parametrize("options", [dict(batching="static"), dict(enable_kv_cache=False)])
def test_what_speculation_cannot_compose_with_is_refused_by_name(options):
    """A static wave's rows take one token a step, and without a KV cache nothing is rolled
    back: both are refused at the door, naming speculative_config, never ignored."""
    from nanoserve.config import ConfigError

    with pytest.raises(ConfigError, match="speculative_config"):
        EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 2},
                     **options)



def test_the_front_door_with_ngram_matches_speculation_off():
    """``LLM(speculative_config=...)`` as a user writes it, against the same LLM with its
    proposer taken away: same outputs, and the counters say proposals were accepted."""
    with LLM(dtype="float32", max_num_seqs=4, block_size=8, enable_prefix_caching=True,
             speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                                 "prompt_lookup_min": 2, "prompt_lookup_max": 4}) as llm:
        prompts = [p[:200] + p[:50] for p in PASSAGES[:4]]
        sp = SamplingParams(temperature=0, max_tokens=40, logprobs=1)
        on = llm.generate(prompts, sp)
        stats = llm.core.snapshot().spec_decode
        proposer, llm.core.proposer = llm.core.proposer, None
        off = llm.generate(prompts, sp)
        llm.core.proposer = proposer
    assert stats.num_accepted_tokens > 0
    for a, b in zip(on, off, strict=True):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        assert [e.token_id for e in a.logprobs] == a.token_ids
        assert [e.token_id for e in a.logprobs] == [e.token_id for e in b.logprobs]


@pytest.mark.slow
def test_tensor_parallel_greedy_identity_with_speculation():
    """``-tp 2``: the verify step's SCORE forward and the TRUNC journal keep the worker's cache
    in step with rank 0's; speculation on and off (the same engine, its proposer taken away)
    say the same under preemption."""
    from multiprocessing import active_children

    prompts = [p[:160] + p[:60] for p in PASSAGES[:3]]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(dtype="float32", tensor_parallel_size=2, max_num_seqs=3, block_size=4,
             num_kv_blocks=40, max_num_batched_tokens=16,
             speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                 "prompt_lookup_min": 1, "prompt_lookup_max": 3}) as llm:
        on = llm.generate(prompts, sp)
        accepted = llm.core.snapshot().spec_decode.num_accepted_tokens
        proposer, llm.core.proposer = llm.core.proposer, None
        off = llm.generate(prompts, sp)
        llm.core.proposer = proposer
    assert accepted > 0
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert not [p for p in active_children() if p.name.startswith("nanoserve-tp")]

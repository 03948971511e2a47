"""A draft model proposes (Day 77): greedy outputs never change, and a good draft is believed.

Three drafts of the shipped model (float32): the shipped model itself (every proposal is the
target's own argmax, so every one is accepted: the strong check that proposals and rollback are
right), its first two layers (``write_truncated_draft``: a realistic cheap draft, partly
accepted, so rows are rolled back every step), and a random checkpoint of the same vocabulary
(nearly nothing accepted). For each, several k, several prompts in a batch, preemption and
chunked catch-up; the draft's proposals are held against what the draft says from scratch;
refusals name both numbers; seeded sampled requests repeat run to run; two ranks say what one
says with the draft on rank 0.
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.config import DEFAULT_MODEL
from nanoserve.spec_decode.draft import DraftModelProposer, write_truncated_draft
from nanoserve.testing import write_hf_checkpoint

PROMPTS = ["The while statement", "Once upon a time there was", "def f(x):", "A list is",
           "import os\nimport sys\n", "class Stack:"]
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """name -> a draft checkpoint folder for the shipped model."""
    root = tmp_path_factory.mktemp("drafts")
    return {"self": str(DEFAULT_MODEL),
            "truncated": str(write_truncated_draft(DEFAULT_MODEL, root / "truncated", 2)),
            "random": str(write_hf_checkpoint(root / "random", "gqa", vocab_size=2048,
                                              max_position_embeddings=1024, bos_token_id=0,
                                              eos_token_id=1))}


@pytest.fixture(scope="module")
def reference():
    """The shipped model's greedy outputs with speculation off, per engine options."""
    cache = {}

    def run(prompts=tuple(PROMPTS), **kw):
        key = (prompts, repr(sorted(kw.items())))
        if key not in cache:
            llm = LLM(dtype="float32", max_num_seqs=4, **kw)
            cache[key] = [o.token_ids for o in llm.generate(list(prompts), GREEDY)]
        return cache[key]

    return run


def speculating(draft: str, k: int, **kw) -> LLM:
    return LLM(dtype="float32", max_num_seqs=4, speculative_config={
        "method": "draft_model", "model": draft, "num_speculative_tokens": k}, **kw)


def drained(llm: LLM) -> None:
    """The draft's rows go back once nobody is running (the target's blocks: LLM checks)."""
    p = llm.core.proposer
    assert p.num_rows_held <= 4
    p.propose([])
    assert p.num_rows_held == 0 and sorted(p.free_rows) == list(range(4))
    assert all(n == 0 for n in p.cache.lengths)


SLOW = pytest.mark.slow  # a random draft is believed almost never: one k is enough for make test


@pytest.mark.parametrize("name, k", [
    *[(n, k) for n in ("self", "truncated") for k in (1, 3, 8)],
    pytest.param("random", 1, marks=SLOW), ("random", 3), pytest.param("random", 8, marks=SLOW),
])
def test_greedy_outputs_are_speculation_offs(drafts, reference, name, k):
    llm = speculating(drafts[name], k)
    got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert got == reference()
    s = llm.core.snapshot().spec_decode
    assert s.num_drafts > 0
    if name == "self":  # the target's own argmax, proposed: all believed
        assert s.acceptance_rate >= 0.95, s
        assert s.mean_acceptance_length > 0.75 * (k + 1), s
    drained(llm)


@pytest.mark.parametrize("options", [
    {"num_kv_blocks": 8},  # preempts and recomputes: rows given back and caught up again
    {"max_num_batched_tokens": 8},  # prompts chunked; the draft catches up 8 tokens a forward
], ids=["preemption", "chunked"])
def test_preemption_and_chunked_catch_up_change_nothing(drafts, reference, options):
    prompts = [p * 3 for p in PROMPTS]  # longer than a catch-up forward
    llm = speculating(drafts["truncated"], 3, **options)
    got = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == reference(tuple(prompts), **options)
    if "num_kv_blocks" in options:
        assert llm.stats.preemptions > 0
    else:
        assert llm.core.proposer.catch_up_tokens == 8
    drained(llm)


def test_proposals_are_what_the_draft_says_from_scratch(drafts):
    """Every proposal, at every step, is the draft's greedy continuation of the request's
    tokens computed without any cache: the rollback kept exactly the right prefix."""
    llm = speculating(drafts["truncated"], 4)
    p = llm.core.proposer
    propose, checked = p.propose, []

    def check(requests):
        propose(requests)
        with torch.inference_mode():
            for r in requests:
                ids = r.token_ids
                for _ in range(len(r.spec_token_ids)):
                    h = p.model(torch.tensor([ids]), torch.arange(len(ids))[None])  # (1, T, E)
                    ids = ids + [int(p.model.compute_logits(h[0, -1]).argmax())]
                assert ids[r.num_tokens:] == r.spec_token_ids
                checked.append(len(r.spec_token_ids))

    p.propose = check
    llm.generate(PROMPTS[:4], GREEDY)
    assert sum(checked) > 40
    s = llm.core.snapshot().spec_decode
    assert 0 < s.num_accepted_tokens < s.num_draft_tokens  # rollbacks happened


def test_a_draft_of_another_vocabulary_or_shorter_reach_is_refused(tmp_path):
    small = write_hf_checkpoint(tmp_path / "small", "gqa")  # vocab 256, 128 positions
    with pytest.raises(ValueError, match=r"vocab_size=256, the target's is 2048"):
        speculating(str(small), 3)
    short = write_hf_checkpoint(tmp_path / "short", "gqa", vocab_size=2048)
    with pytest.raises(ValueError, match=r"max_position_embeddings=128, below the target's "
                                         r"max_model_len=1024"):
        speculating(str(short), 3)
    llm = speculating(str(short), 3, max_model_len=128)  # within its reach: accepted
    assert "draft_model" in llm.core.proposer.describe()


def test_describe_says_the_path_params_and_k(drafts):
    llm = speculating(drafts["truncated"], 5)
    line = llm.core.proposer.describe()
    assert drafts["truncated"] in line and "M params, 2 layers" in line
    assert "5 tokens a step" in line


def test_sampled_requests_carry_q_and_repeat_run_to_run(drafts):
    params = [SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, top_k=50, seed=s,
                             ignore_eos=True) for s in range(4)]
    runs, shapes = [], []
    for _ in range(2):
        llm = speculating(drafts["truncated"], 3)
        p = llm.core.proposer
        propose = p.propose

        def look(requests, propose=propose):
            propose(requests)
            for r in requests:
                q = r.spec_draft_probs
                if r.spec_token_ids:
                    assert q is not None and q.dtype == torch.float32
                    assert q.shape == (len(r.spec_token_ids), 2048)
                    assert torch.allclose(q.sum(-1), torch.ones(len(q)), atol=1e-5)
                    chosen = q[torch.arange(len(q)), torch.tensor(r.spec_token_ids)]
                    assert (chosen > 0).all()  # drawn from q
                    assert ((q > 0).sum(-1) <= 50).all()  # top-k applied
                    shapes.append(q.shape[0])

        p.propose = look
        runs.append([o.token_ids for o in llm.generate(PROMPTS[:4], params)])
        drained(llm)
    assert runs[0] == runs[1]
    assert shapes


def test_a_greedy_request_in_a_sampled_batch_has_no_q(drafts):
    llm = speculating(drafts["truncated"], 3)
    seen = []
    propose = llm.core.proposer.propose

    def look(requests):
        propose(requests)
        seen.extend((r.params.greedy, r.spec_draft_probs is None) for r in requests
                    if r.spec_token_ids)

    llm.core.proposer.propose = look
    llm.generate(PROMPTS[:2], [GREEDY, SamplingParams(max_tokens=16, temperature=1.0, seed=7)])
    assert {g for g, _ in seen} == {True, False}
    assert all(g == none for g, none in seen)


def test_two_ranks_with_a_draft_say_what_one_says(drafts, reference):
    with LLM(dtype="float32", max_num_seqs=4, tensor_parallel_size=2, speculative_config={
            "method": "draft_model", "model": drafts["truncated"],
            "num_speculative_tokens": 3}) as llm:
        assert isinstance(llm.core.proposer, DraftModelProposer)  # rank 0's, a plain model
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert llm.core.snapshot().spec_decode.num_accepted_tokens > 0
    assert got == reference()
    assert not [c for c in multiprocessing.active_children() if c.name.startswith("nanoserve-tp")]


def test_a_score_message_carries_each_rows_want():
    """The workers compute as many logits as rank 0 (the LM head's gather joins them), so a
    verify step's message says how many each row wants."""
    from nanoserve.tp import protocol

    m = protocol.Message(protocol.SCORE, [2, 0], [[5, 6, 7, 8], [9]], frozenset(), [6, 2, 3],
                         [4, 1])
    assert protocol.decode(protocol.encode(m)) == m
    with pytest.raises(ValueError, match="one count per row"):
        protocol.encode(protocol.Message(protocol.SCORE, [2, 0], [[5], [9]], frozenset(), []))

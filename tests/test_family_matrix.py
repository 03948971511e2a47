"""Every family on every attention backend against transformers, and windows by hypothesis.

The ``slow`` tier holds the whole matrix of ``tools/family_matrix.py`` (which prints it as the
closing note's table), with that script's functions and checkpoints: each family's
representative (``family_matrix.CASES``: Llama GQA; Qwen2 windowed by max_window_layers; Qwen3
windowed by layer_types with head_dim 32 over hidden/heads 16; Mistral windowed; Phi-3 with a
partial rotary and a window; Gemma 3 local/global; a multimodal Gemma 3's language model) on each
backend that runs here, float32: every prefill and decode logit within 1e-5 of transformers',
greedy tokens identical whole, and identical under chunked prefill, prefix caching and a pool
that preempts (at least once), every block back after each drain; and the same under ``-tp 2``.
One representative per family stays in the default tier in the per-family files
(``test_families``, ``test_mistral``, ``test_phi3``, ``test_gemma3``, ``test_tp_families``,
``test_window_backends``).

The default tier holds a hypothesis test over what a window meets in a paged cache: one
Mistral checkpoint (4 heads over 2, head_dim 32 where hidden/heads is 16), its window drawn from
1 to 24 tokens (shorter and longer than prompts of 1 to 30), blocks of 1 to 16 tokens, a chunk
budget, prefix caching (prompts sharing a drawn prefix), a pool that may be cramped, and the
backend: the engine's greedy tokens equal the uncached forward's (nanoserve's own causal
attention, held to transformers in ``test_mistral``), and every block comes back. And the
multimodal checkpoint's language model as ``-tp 2`` reads it, without starting a process: its
names a text model's, its vision tower unread (this once failed with a missing tensor).
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nanoserve import LLM, SamplingParams
from nanoserve.config import ModelConfig
from nanoserve.model.weights import hf_to_nanoserve, load_model
from nanoserve.tp.load import read_slices
from nanoserve.tp.shard import ShardPlan
from tools import family_matrix as fm

BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(fm.why_not(b) is not None,
                                                     reason=str(fm.why_not(b))))
            for b in fm.BACKENDS]


@pytest.fixture(scope="module")
def ckpt(hf_checkpoint):
    """family -> its representative checkpoint (shared with other files' fixtures)."""
    def make(family):
        name, overrides, _ = fm.CASES[family]
        return hf_checkpoint(name, family=family, **overrides)
    return make


_expected: dict = {}


def expected(path):
    if path not in _expected:
        _expected[path] = fm.transformers_greedy(path)
    return _expected[path]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", list(fm.CASES))
def test_the_family_on_the_backend(ckpt, family, backend):
    path = ckpt(family)
    cell = fm.Cell(family, backend)
    fm.single_columns(path, backend, expected(path), cell)
    assert cell.logit_diff <= fm.BOUND, f"max |logit difference| {cell.logit_diff:.2e}"
    assert cell.greedy, "whole prompts: tokens differ from transformers'"
    assert cell.cramped, "chunked + prefix caching + preemption: tokens differ"
    assert cell.preemptions > 0 and cell.prefix_hits > 0, (cell.preemptions, cell.prefix_hits)
    assert cell.leak is None, cell.leak


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", list(fm.CASES))
def test_the_family_on_the_backend_over_two_ranks(ckpt, family, backend):
    path = ckpt(family)
    cell = fm.Cell(family, backend, leak=None)
    fm.tp_columns(path, backend, expected(path), cell)
    assert cell.tp_diff <= fm.BOUND, f"-tp 2: max |logit difference| {cell.tp_diff:.2e}"
    assert cell.tp_greedy, "-tp 2: tokens differ from transformers'"
    assert cell.leak is None, cell.leak


def test_two_ranks_read_a_multimodal_checkpoints_language_model(ckpt):
    """Each rank's slices of a Gemma3ForConditionalGeneration checkpoint carry a text model's
    names (so they rename and fuse like one rank's load) and no vision tensor is read."""
    path = ckpt("gemma3-vision")
    cfg = ModelConfig.from_dir(path)
    for rank in (0, 1):
        plan = ShardPlan(cfg, 2, rank)
        hf, _ = read_slices(path, plan)
        assert not [n for n in hf if "vision" in n or "projector" in n]
        state = hf_to_nanoserve(hf, plan.local)
        assert "embed_tokens.weight" in state and any(".q_norm." in n for n in state)


# ------------------------------------------------------------------ windows, by hypothesis

STEPS = 6
RUNNABLE = fm.runnable_backends()
TOKEN = st.integers(1, 254)


@pytest.fixture(scope="module")
def windows(hf_checkpoint, tmp_path_factory):
    """window -> (folder, uncached model): one Mistral checkpoint's weights (linked, not
    copied) under a config.json whose sliding_window is ``window``."""
    src = hf_checkpoint("head_dim", family="mistral", sliding_window=8)
    root, cache = tmp_path_factory.mktemp("mistral-windows"), {}

    def get(window):
        if window not in cache:
            dst = root / f"w{window}"
            dst.mkdir()
            for f in src.iterdir():
                if f.name != "config.json":
                    (dst / f.name).symlink_to(f)
            d = json.loads((src / "config.json").read_text())
            assert d["head_dim"] * d["num_attention_heads"] != d["hidden_size"]
            (dst / "config.json").write_text(json.dumps({**d, "sliding_window": window}))
            cache[window] = dst, load_model(dst, "float32")
        return cache[window]
    return get


def uncached_greedy(model, ids: list[int], steps: int = STEPS) -> list[int]:
    """Greedy tokens by the uncached forward (no backend: the causal mask's window), the whole
    sequence recomputed for each token."""
    ids, out = list(ids), []
    with torch.inference_mode():
        for _ in range(steps):
            hidden = model(torch.tensor([ids]), torch.arange(len(ids))[None])  # (1, T, E)
            out.append(int(model.compute_logits(hidden[0, -1]).argmax()))
            ids.append(out[-1])
    return out


@st.composite
def prompt_sets(draw):
    """One to three prompts of 1 to 30 tokens sharing a drawn prefix (a prefix cache's hits)."""
    prefix = draw(st.lists(TOKEN, max_size=16))
    return draw(st.lists(st.lists(TOKEN, min_size=0 if prefix else 1,
                                  max_size=30 - len(prefix)).map(lambda t: prefix + t),
                         min_size=1, max_size=3))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(window=st.integers(1, 24), block_size=st.sampled_from([1, 2, 3, 4, 5, 8, 16]),
       prompts=prompt_sets(), budget=st.integers(4, 40), caching=st.booleans(),
       cramped=st.booleans(), backend=st.sampled_from(RUNNABLE))
@example(window=1, block_size=16, prompts=[list(range(1, 31))], budget=7, caching=False,
         cramped=True, backend=RUNNABLE[-1])
@example(window=24, block_size=3, prompts=[[5, 6, 7] * 3 + [9], [5, 6, 7] * 3 + [1, 2]],
         budget=4, caching=True, cramped=True, backend=RUNNABLE[-1])
def test_a_windowed_engine_says_what_the_uncached_forward_says(windows, window, block_size,
                                                               prompts, budget, caching,
                                                               cramped, backend):
    path, model = windows(window)
    options = dict(fm.engine_options(backend), block_size=block_size, max_num_seqs=4,
                   max_num_batched_tokens=budget, enable_prefix_caching=caching)
    if cramped:  # the longest request alone, and the null block: the rest waits or preempts
        longest = max(map(len, prompts)) + STEPS
        options["num_kv_blocks"] = -(-longest // block_size) + 1
    llm = LLM(str(path), **options)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=STEPS,
                                                ignore_eos=True))
    assert [o.token_ids for o in outs] == [uncached_greedy(model, p) for p in prompts]
    llm.core.check_drained()

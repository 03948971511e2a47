"""Mistral's sliding window against transformers, on checkpoints MistralForCausalLM wrote.

A window of 4 tokens is shorter than every prompt but one, so most queries see only part of
their prefix. The plain path (``attention="reference"``, ``kernels=False``) is held against
transformers' greedy tokens and logits: whole prompts, chunked prefill (chunks of 8 tokens cross
the window's edge) and the uncached forward. The gathered mapping (``attention="gathered"``) is
held to the same bounds on the whole and chunked paths, and its decode read is checked against
the rectangle's with chunks of 4 cells, so the window's edge falls inside and across chunks. The
same checkpoint with its window removed gives other logits, and a gathered decode read that
dropped the window would fail, so a path that ignored it is caught. The C++ and Triton kernels
read it too (``tests/test_window_backends.py``); ``auto`` with the C++ ops picks the C++ kernel.
"""

from __future__ import annotations

import json

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.attention.backends import gathered as gathered_mod
from nanoserve.attention.reference import paged_attention_batched_reference
from nanoserve.testing import greedy_logits, hf_greedy, load_hf_model

WINDOW = 4
KW = dict(dtype="float32", skip_tokenizer_init=True, attention="reference", kernels=False)
PATHS = {"whole": {}, "chunked": {"max_num_batched_tokens": 8, "max_num_seqs": 4},
         "uncached": {"enable_kv_cache": False}}
PROMPTS = [[5, 17, 3, 99, 42], [200, 7, 7, 1, 64, 80, 31, 12, 9, 150, 4, 77], [11, 22, 33]]
STEPS = 12


@pytest.fixture(scope="module")
def windowed(hf_checkpoint):
    return hf_checkpoint("gqa", family="mistral", sliding_window=WINDOW)


@pytest.fixture(scope="module")
def unwindowed(windowed, tmp_path_factory):
    """The same weights, ``sliding_window: null``: full causal attention."""
    path = tmp_path_factory.mktemp("mistral-full")
    for f in windowed.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    d = json.loads((windowed / "config.json").read_text())
    d["sliding_window"] = None
    (path / "config.json").write_text(json.dumps(d))
    return path


def transformers_greedy(path):
    return hf_greedy(path, PROMPTS, STEPS)


@pytest.fixture(scope="module")
def expected(windowed):
    return transformers_greedy(windowed)


def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def test_transformers_windows_the_prompt(windowed, unwindowed):
    """The reference itself: the full-prompt logits of the windowed model differ from the
    unwindowed one's, and transformers masks i - j < window (not <=)."""
    a, b = load_hf_model(windowed), load_hf_model(unwindowed)
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        la, lb = a(ids).logits[0], b(ids).logits[0]
    assert (la[:WINDOW] - lb[:WINDOW]).abs().max() < 1e-5  # the window holds the whole prefix
    assert (la[WINDOW:] - lb[WINDOW:]).abs().max(dim=-1).values.min() > 1e-4


CASES = [("reference", p) for p in sorted(PATHS)] + [("gathered", "chunked"),
                                                     ("gathered", "whole")]


@pytest.mark.parametrize("attention,path", CASES)
def test_tokens_and_logits_match_transformers(windowed, expected, attention, path):
    llm = LLM(str(windowed), **{**KW, "attention": attention}, **PATHS[path])
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=STEPS,
                                                ignore_eos=True))
    for p, out, (tokens, logits) in zip(PROMPTS, outs, expected, strict=True):
        assert out.token_ids == tokens
        if path == "uncached":
            continue  # greedy_logits reads the engine's cache
        ours = greedy_logits(llm, p, STEPS)  # prefill logits, then each decode's
        diff = max_diff(ours, logits)
        assert diff <= 1e-5, f"{attention} {path}: max |logit difference| {diff:.2e}"


def test_the_window_is_not_ignored(windowed, unwindowed, expected):
    full = transformers_greedy(unwindowed)
    ours = LLM(str(unwindowed), **KW)
    for p, (_, logits) in zip(PROMPTS, full, strict=True):  # our full path matches theirs
        assert max_diff(greedy_logits(ours, p, STEPS), logits) <= 1e-5
    llm = LLM(str(windowed), **KW)
    ours = greedy_logits(llm, PROMPTS[1], STEPS)  # 12 tokens, a window of 4
    assert (ours[0] - full[1][1][0]).abs().max().item() > 1e-3  # windowed prefill differs


def test_a_gathered_read_without_the_window_fails(windowed, expected, monkeypatch):
    """The gathered decode read is what windows decode steps: dropping its window argument
    moves the decode logits far past the bound (the prefill, read elsewhere, still matches)."""
    real = gathered_mod.paged_attention_gathered

    def unwindowed_read(q, kp, vp, cells, chunk_b, chunk_pos=None, q_pos=None, window=None):
        return real(q, kp, vp, cells, chunk_b)

    llm = LLM(str(windowed), **{**KW, "attention": "gathered"})
    ours = greedy_logits(llm, PROMPTS[1], STEPS)
    assert max_diff(ours, expected[1][1]) <= 1e-5
    monkeypatch.setattr(gathered_mod, "paged_attention_gathered", unwindowed_read)
    ours = greedy_logits(llm, PROMPTS[1], STEPS)
    assert (ours[0] - expected[1][1][0]).abs().max().item() <= 1e-5
    assert max_diff(ours[1:], expected[1][1][1:]) > 1e-3


@pytest.mark.parametrize("window", [1, 3, 4, 6, 100])
def test_the_gathered_decode_read_windows_by_position(window):
    """Chunks of 4 cells, rows of 1 to 14 tokens in scattered cells: the gathered read equals
    the rectangle's with the same window, and differs from the unwindowed read where the
    window is shorter than a row."""
    g = torch.Generator().manual_seed(window)
    ctx, Hq, Hkv, D = [14, 1, 9, 5], 4, 2, 8
    cells = torch.randperm(64, generator=g)
    slots = torch.full((len(ctx), 16), -1, dtype=torch.long)
    s = 0
    for r, c in enumerate(ctx):
        slots[r, :c], s = cells[s:s + c], s + c
    kp, vp = torch.randn(64, Hkv, D, generator=g), torch.randn(64, Hkv, D, generator=g)
    q = torch.randn(len(ctx), Hq, D, generator=g)
    index = gathered_mod.GatheredIndex(len(ctx), chunk=4)
    rows = list(range(len(ctx)))
    for grown in (0, 1):  # a join, then a steady step (rows 1 and 3 open a chunk)
        c = [n - 1 + grown for n in ctx]
        new = slots[rows, [n - 1 for n in c]]
        got_cells, chunk_b = index.update(rows, c, new, slots)
    pos = torch.tensor(ctx) - 1
    got = gathered_mod.paged_attention_gathered(q, kp, vp, got_cells, chunk_b,
                                                index.chunk_pos[:index.n], pos, window)
    ref = paged_attention_batched_reference(q[:, :, None], kp, vp, slots[:, :max(ctx)],
                                            pos[:, None], torch.tensor(ctx), window)[:, :, 0]
    assert (got - ref).abs().max().item() < 1e-5
    full = gathered_mod.paged_attention_gathered(q, kp, vp, got_cells, chunk_b)
    for r, c in enumerate(ctx):
        assert ((got[r] - full[r]).abs().max().item() > 1e-4) == (window < c)


def test_auto_serves_the_window_through_the_cpu_kernel(windowed):
    llm = LLM(str(windowed), dtype="float32", skip_tokenizer_init=True, kernels=True)
    assert llm.engine.cache.attention == "cpu"

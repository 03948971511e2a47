"""``-tp 2`` for every family built from Llama's layers, held against transformers.

Each case is a small random checkpoint written by transformers' own class for the family
(``testing.write_hf_checkpoint``): Qwen2 with its q/k/v biases, Qwen3 with per-head q/k norms,
an ``attention_bias`` on q, k, v and o and a head_dim of 32 where hidden / heads is 16 (and
with one KV head, whose k norm both ranks then hold, and a tied head over a split vocabulary), and
Mistral with a window of 4 tokens, shorter than the 12-token prompt, on the backends that read
a window. Two ranks (a spawned worker over gloo) must give transformers' greedy tokens and its
logits within 1e-5 in float32: the row-parallel o bias added once, the q/k norms' (D,) weights
on both ranks and the window on both ranks' caches are all inside that bound, and a rank that
dropped any of them would not be (the window: transformers' own logits without it differ by far
more). The split itself (fused q|k|v and gate|up tensors, norms read whole) is checked without
starting a process. Qwen3 runs in the default tier; the rest are ``slow``.
"""

from __future__ import annotations

import json
import multiprocessing

import pytest
import torch
from torch import nn

from nanoserve import LLM, SamplingParams
from nanoserve.config import ModelConfig
from nanoserve.layers.linear import Linear
from nanoserve.model import llama as llama_mod
from nanoserve.model.qwen2 import Qwen2
from nanoserve.testing import greedy_logits, hf_greedy, load_hf_model
from nanoserve.tp.layers import tp_class
from nanoserve.tp.load import read_slices
from nanoserve.tp.shard import ShardPlan

WINDOWED = {"attention": "reference", "kernels": False}  # the C++ kernel refuses a window
CASES = {  # id -> (family, testing.CONFIGS name, checkpoint overrides, engine options)
    "qwen3-bias-head_dim": ("qwen3", "bias", {"head_dim": 32}, {}),
    "qwen3-one-kv-head-tied": ("qwen3", "head_dim", {"num_key_value_heads": 1,
                                                     "tie_word_embeddings": True}, {}),
    "qwen2-gqa": ("qwen2", "gqa", {}, {}),
    "mistral-window-reference": ("mistral", "gqa", {"sliding_window": 4}, WINDOWED),
    "mistral-window-gathered": ("mistral", "gqa", {"sliding_window": 4},
                                {"attention": "gathered", "kernels": False}),
    "mistral-window-chunked": ("mistral", "gqa", {"sliding_window": 4},
                               {**WINDOWED, "max_num_batched_tokens": 8, "max_num_seqs": 4}),
    # fused q|k|v and gate|up in the checkpoint, a partial rotary, a window of 5
    "phi3-partial": ("phi3", "phi3-partial", {}, {}),
    "phi3-window": ("phi3", "phi3-window", {}, WINDOWED),
    # four norms a layer, (1 + w) norms on q and k, GeGLU, local and global RoPE, a window
    "gemma3": ("gemma3", "gemma3", {}, WINDOWED),
}
DEFAULT_TIER = {"qwen3-bias-head_dim"}
KW = dict(dtype="float32", skip_tokenizer_init=True)
PROMPTS = [[5, 17, 3, 99, 42], [200, 7, 7, 1, 64, 80, 31, 12, 9, 150, 4, 77], [11, 22, 33]]
STEPS = 12
BOUND = 1e-5  # float32 logits against transformers: measured up to 2.4e-6 over two ranks


def alive_workers() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("nanoserve-tp")]


@pytest.fixture(scope="module")
def case(hf_checkpoint):
    def make(cid):
        family, name, kw, _ = CASES[cid]
        return hf_checkpoint(name, family=family, **kw)
    return make


def transformers_greedy(path) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Per prompt: transformers' greedy tokens and the logits that chose them."""
    return hf_greedy(path, PROMPTS, STEPS)


@pytest.mark.parametrize("cid", [pytest.param(c, marks=() if c in DEFAULT_TIER
                                              else pytest.mark.slow) for c in CASES])
def test_two_ranks_say_what_transformers_says(case, cid):
    path = case(cid)
    expected = transformers_greedy(path)
    with LLM(str(path), **KW, **CASES[cid][3], tensor_parallel_size=2) as llm:
        assert llm.engine.cache.windows == llm.engine.model.windows  # rank 0's; rank 1 likewise
        for p, (tokens, logits) in zip(PROMPTS, expected, strict=True):
            got = greedy_logits(llm, p, STEPS)
            diff = max((a - b).abs().max().item() for a, b in zip(got, logits, strict=True))
            assert diff <= BOUND, f"{cid}: max |logit difference| {diff:.2e}"
            assert [int(g.argmax()) for g in got] == tokens, cid
        batch = llm.generate(PROMPTS, SamplingParams(max_tokens=STEPS, temperature=0,
                                                      ignore_eos=True))
        assert [o.token_ids for o in batch] == [t for t, _ in expected], cid
        kv = llm.core.scheduler.kv_cache_manager
        assert kv.num_free == kv.num_blocks
    assert not alive_workers()


@pytest.mark.slow
def test_the_window_changes_what_transformers_says(case, tmp_path):
    """The window bound above means something: without it transformers' logits move."""
    path = case("mistral-window-reference")
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    d = json.loads((path / "config.json").read_text())
    d["sliding_window"] = None
    (tmp_path / "config.json").write_text(json.dumps(d))
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        windowed, full = (load_hf_model(p)(ids).logits for p in (path, tmp_path))
    assert (windowed - full).abs().max().item() > 100 * BOUND


# ---------------------------------------------------------------------- the split, no process

def test_fused_qkv_and_gate_up_are_cut_per_part(case):
    """A checkpoint storing q|k|v and gate|up fused (Phi-3) gives each rank the rows it would
    get from the parts stored apart: its q heads, its KV heads of k and of v; its MLP columns
    of gate and of up."""
    cfg = ModelConfig.from_dir(case("qwen3-bias-head_dim"))  # Hq 4, Hkv 2, D 32, I 128
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, cfg.hidden_size, generator=g)
               for n in (cfg.q_size, cfg.kv_size, cfg.kv_size))
    gate, up = (torch.randn(cfg.intermediate_size, cfg.hidden_size, generator=g)
                for _ in range(2))
    qb = torch.randn(cfg.q_size + 2 * cfg.kv_size, generator=g)
    p = "model.layers.0."
    for r in (0, 1):
        plan = ShardPlan(cfg, 2, r)
        apart = torch.cat([plan.take(p + f"self_attn.{n}_proj.weight", t)
                           for n, t in zip("qkv", (q, k, v), strict=True)])
        assert torch.equal(plan.take(p + "self_attn.qkv_proj.weight", torch.cat([q, k, v])),
                           apart)
        assert apart.shape[0] == plan.local.q_size + 2 * plan.local.kv_size
        bias = plan.take(p + "self_attn.qkv_proj.bias", qb)
        assert torch.equal(bias, torch.cat([plan.take(p + f"self_attn.{n}_proj.bias", t) for
                                            n, t in zip("qkv", qb.split(
                                                [cfg.q_size, cfg.kv_size, cfg.kv_size]),
                                                strict=True)]))
        assert torch.equal(plan.take(p + "mlp.gate_up_proj.weight", torch.cat([gate, up])),
                           torch.cat([plan.take(p + "mlp.gate_proj.weight", gate),
                                      plan.take(p + "mlp.up_proj.weight", up)]))


def test_qk_norms_are_whole_and_biases_follow_their_heads(case):
    path = case("qwen3-bias-head_dim")
    cfg = ModelConfig.from_dir(path)
    (a, _), (b, _) = (read_slices(path, ShardPlan(cfg, 2, r)) for r in (0, 1))
    for name in a:
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            assert a[name].shape == (cfg.head_dim,) and torch.equal(a[name], b[name]), name
        elif name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
            assert a[name].shape[0] == b[name].shape[0] == a[name.replace("bias", "weight")] \
                .shape[0], name
        elif name.endswith("o_proj.bias"):  # added once: rank 0 holds it, rank 1 zeros
            assert a[name].any() and not b[name].any(), name


def test_a_family_that_does_not_declare_it_is_refused(case, monkeypatch):
    monkeypatch.setattr(Qwen2, "tensor_parallel", False)
    with pytest.raises(ValueError, match="tensor_parallel_size=2: .*does not build Qwen2 .*"
                                         "tensor_parallel = True"):
        LLM(str(case("qwen2-gqa")), **KW, tensor_parallel_size=2)
    assert not alive_workers()


class _Unhinted(llama_mod.Llama):  # a family whose MLP forgot to say how down is cut
    def __init__(self, cfg, max_model_len=None):
        super().__init__(cfg, max_model_len)
        for layer in self.layers:
            layer.mlp.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)


class _ScaledEmbedding(nn.Embedding):
    pass


class _OwnEmbedding(llama_mod.Llama):  # a family whose embedding module adds something
    def __init__(self, cfg, max_model_len=None):
        super().__init__(cfg, max_model_len)
        self.embed_tokens = _ScaledEmbedding(cfg.vocab_size, cfg.hidden_size)


@pytest.mark.parametrize("family, why", [(_Unhinted, "layers.0.mlp.down_proj declares no "
                                                     "parallel="),
                                         (_OwnEmbedding, "embed_tokens is a _ScaledEmbedding")])
def test_a_family_tp_cannot_cut_is_refused_at_build(case, family, why):
    plan = ShardPlan(ModelConfig.from_dir(case("qwen2-gqa")), 2, 0)
    with torch.device("meta"), pytest.raises(ValueError, match=why):
        tp_class(family)(plan, comm=None)

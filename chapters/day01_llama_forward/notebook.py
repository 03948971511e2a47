# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 1 notebook: one forward pass, held against transformers
#
# What this notebook does, on a CPU in well under a minute:
#
# 1. writes small random Llama checkpoints *with transformers itself* (`save_pretrained`), in
#    the folder layout of a published model;
# 2. loads each folder twice, once with nanoserve and once with transformers'
#    `LlamaForCausalLM`, and compares the logits;
# 3. follows one batch through a decoder layer and prints every tensor's shape;
# 4. plots the RoPE frequencies of Llama-3.2-1B with and without `llama3` scaling;
# 5. counts parameters, and asks the shipped nanoserve-tiny model for its next token.

# %%
import pathlib
import sys
import time
import warnings

# transformers imports tqdm, which warns inside Jupyter when ipywidgets is absent.
warnings.filterwarnings("ignore", message="IProgress not found")

# The repository root: found from the working directory (a Jupyter kernel may start in the
# chapter folder or at the root, and has no __file__), or from this file when run as a script.
_starts = [pathlib.Path.cwd()]
if "__file__" in globals():
    _starts.insert(0, pathlib.Path(__file__).resolve().parent)
ROOT = next(p for s in _starts for p in [s, *s.parents] if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import LLAMA_3_2_1B, SHIPPED, hf_checkpoint
from chapters.day01_llama_forward.snapshot.weights import load_model as load_snapshot
from nanoserve.config import ModelConfig
from nanoserve.layers.rotary import rope_inv_freq
from nanoserve.model.llama import Llama
from nanoserve.model.weights import load_model
from nanoserve.testing import CONFIGS, load_hf_model, relative_logit_error

torch.set_num_threads(2)
print("repository root:", ROOT)
print("torch", torch.__version__)

# %% [markdown]
# ## 1. Five checkpoints, each exercising one thing the loader must get right
#
# Every configuration starts from the same small base (hidden 64, 2 layers, vocab 256) and
# changes one feature: grouped-query attention, tied embeddings, `llama3` RoPE scaling, an
# explicit `head_dim` that is *not* hidden / heads, and biases on every projection.

# %%
for name, overrides in CONFIGS.items():
    print(f"{name:12s} {overrides}")

# %% [markdown]
# ## 2. Logits: nanoserve vs transformers on the same files
#
# Two batch rows of 64 random token ids. `relative_logit_error` is the largest absolute
# difference divided by the largest absolute logit, so it does not depend on the logits' scale.
# Both the live package and the frozen Day 1 snapshot (which reads safetensors with nothing
# but `json`, `struct` and torch) are checked.

# %%
ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
pos = torch.arange(64)[None].expand(2, 64)  # (B, T) absolute positions

t0 = time.perf_counter()
print(f"{'config':12s} {'live package':>14s} {'Day 1 snapshot':>15s}   greedy tokens agree")
for name in CONFIGS:
    folder = hf_checkpoint(name)  # transformers wrote it
    ref = load_hf_model(folder)
    with torch.no_grad():
        want = ref(ids).logits  # (B, T, V)
        errors = []
        for loader in (load_model, load_snapshot):
            ours = loader(folder)
            got = ours.compute_logits(ours(ids, pos))  # (B, T, V)
            errors.append(relative_logit_error(got, want))
    agree = bool((got.argmax(-1) == want.argmax(-1)).all())
    print(f"{name:12s} {errors[0]:14.2e} {errors[1]:15.2e}   {agree}")
print(f"({time.perf_counter() - t0:.1f} s, including writing the checkpoints)")

# %% [markdown]
# On the CPU this book is built on, the error is usually exactly zero: the same fp32 operations
# in the same order give the same bits. The claim only promises ≤ 1e-6, because a different
# BLAS library or thread count may sum in a different order.

# %% [markdown]
# ## 3. One decoder layer, shape by shape
#
# Forward hooks print what enters and leaves each module of the first layer of the `gqa`
# checkpoint (8 query heads sharing 2 KV heads, head_dim 8). The fused `qkv_proj` emits
# Hq·D + 2·Hkv·D = 64 + 16 + 16 = 96 features per token.

# %%
model = load_model(hf_checkpoint("gqa"), "float32")
cfg = model.cfg
print(f"E={cfg.hidden_size} Hq={cfg.num_attention_heads} Hkv={cfg.num_key_value_heads} "
      f"D={cfg.head_dim} I={cfg.intermediate_size} V={cfg.vocab_size}")

handles = []
for name, module in model.layers[0].named_modules():
    if not name:  # the layer itself
        continue

    def show(mod, inputs, output, name=name):
        print(f"  layers.0.{name:26s} {tuple(inputs[0].shape)!s:>12} -> {tuple(output.shape)}")

    handles.append(module.register_forward_hook(show))
with torch.no_grad():
    hidden = model(ids[:, :5], pos[:, :5])  # B=2, T=5
    logits = model.compute_logits(hidden)
for h in handles:
    h.remove()
print(f"hidden {tuple(hidden.shape)} -> logits {tuple(logits.shape)} {logits.dtype}")

# %% [markdown]
# Inside attention, the views are the ones the shape comments in `nanoserve/model/llama.py` promise.
# Grouped-query attention never copies the KV heads: `scaled_dot_product_attention` with
# `enable_gqa=True` lets each group of Hq/Hkv = 4 query heads read the same key and value head.

# %%
B, T = 2, 5
q = torch.zeros(B, T, cfg.q_size).view(B, T, cfg.num_attention_heads, cfg.head_dim)
k = torch.zeros(B, T, cfg.kv_size).view(B, T, cfg.num_key_value_heads, cfg.head_dim)
print("q", tuple(q.transpose(1, 2).shape), " # (B, Hq, T, D)")
print("k", tuple(k.transpose(1, 2).shape), " # (B, Hkv, T, D)")
print("query head h reads KV head h //", cfg.num_attention_heads // cfg.num_key_value_heads,
      ":", [h // (cfg.num_attention_heads // cfg.num_key_value_heads)
            for h in range(cfg.num_attention_heads)])

# %% [markdown]
# ## 4. RoPE frequencies: what `llama3` scaling changes
#
# Each of the D/2 = 32 pairs of a Llama-3.2-1B head rotates at its own frequency. `llama3`
# scaling leaves the fast pairs alone (wavelength under 8192 / 4 = 2048 positions), slows the
# slow ones by the factor 32 (wavelength over 8192 / 1 = 8192), and blends the band between.

# %%
import matplotlib.pyplot as plt

# The book's palette (diagrams/style.py), spelled out: importing that module would switch
# matplotlib to Agg, and the site build needs the inline backend to capture this figure.
GREY, ORANGE, RED = "#7a7a7a", "#e8a33d", "#d1495b"

big = ModelConfig.from_dict(LLAMA_3_2_1B)
plain = ModelConfig.from_dict({**LLAMA_3_2_1B, "rope_scaling": None})
f_plain, f_scaled = rope_inv_freq(plain), rope_inv_freq(big)
ratio = f_plain / f_scaled  # 1 where untouched, 32 where slowed, in between where blended
kind = ["kept" if r == 1 else "slowed 32x" if torch.isclose(r, torch.tensor(32.0)) else "blended"
        for r in ratio]
print({k: kind.count(k) for k in ("kept", "blended", "slowed 32x")})
for i, what in enumerate(kind):
    edge = i in (0, len(kind) - 1) or what != kind[i - 1] or what != kind[i + 1]
    if edge or what == "blended":
        print(f"pair {i:2d} ({what:10s}): wavelength {2 * torch.pi / f_plain[i]:>10,.0f} -> "
              f"{2 * torch.pi / f_scaled[i]:>11,.0f} positions")

fig, ax = plt.subplots(figsize=(8, 3.6))
ax.semilogy(2 * torch.pi / f_plain, "o-", color=GREY, markersize=3, label="rope_theta only")
ax.semilogy(2 * torch.pi / f_scaled, "o-", color=ORANGE, markersize=3,
            label="llama3 scaling (factor 32)")
for y, text in ((2048, "8192 / high_freq_factor"), (8192, "8192 / low_freq_factor")):
    ax.axhline(y, color=RED, linestyle="--", linewidth=0.8)
    ax.text(0.5, y * 1.25, text, color=RED, fontsize=8)
ax.set_xlabel("rotation pair i (of D/2 = 32)")
ax.set_ylabel("wavelength (positions)")
ax.set_title("Llama-3.2-1B RoPE wavelengths, with and without llama3 scaling")
ax.legend(frameon=False)
fig.tight_layout()

# %% [markdown]
# ## 5. Parameters, and the shipped model
#
# The model is built on the `meta` device, which records shapes without allocating memory, so
# counting Llama-3.2-1B's 1.2 billion parameters costs nothing. Tied embeddings mean the LM head
# *is* the embedding table: it is counted, stored and loaded once.

# %%
with torch.device("meta"):
    n = Llama(big).num_parameters()
print(f"Llama-3.2-1B: {n:,} parameters, {n * 2 / 1e9:.2f} GB in bf16, "
      f"embedding share {128256 * 2048 / n:.1%}")

if (SHIPPED / "model.safetensors").is_file():
    from tokenizers import Tokenizer

    tiny = load_model(SHIPPED, "float32")
    tok = Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    print(f"nanoserve-tiny: {tiny.num_parameters():,} parameters, "
          f"{(SHIPPED / 'model.safetensors').stat().st_size / 1e6:.1f} MB on disk")
    prompt = "The for statement is used to"
    ids1 = torch.tensor([tok.encode(prompt).ids])
    with torch.no_grad():
        last = tiny.compute_logits(tiny(ids1, torch.arange(ids1.shape[1])[None])[:, -1])
    top = last[0].softmax(-1).topk(5)
    print(f"after {prompt!r}, the five likeliest next tokens:")
    for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        print(f"  {tok.decode([i])!r:16s} {p:.3f}")
else:
    print(f"nanoserve-tiny is not in {SHIPPED} yet; run `make train-tiny` to train it")

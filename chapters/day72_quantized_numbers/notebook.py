# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 72 notebook: what a quantized number is
#
# A quantized weight is an integer, a scale per group and sometimes a zero point. This notebook
# builds one by hand, counts what it costs in bytes on a published model's shape, measures what
# it costs in error on the shipped nanoserve-tiny's own weights, stores it the way
# compressed-tensors does, and hands the file back to that library. Nothing is timed; it runs in
# a few seconds on a CPU.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day72_quantized_numbers import claims
from chapters.day72_quantized_numbers.snapshot.grid import pack_nibbles, quantize_group
from nanoserve.quantization.packing import pack_int32, unpack_int32
from nanoserve.quantization.rtn import quantize_per_token, quantize_rtn

# %% [markdown]
# ## 1. One group, by hand
#
# The first eight weights of row 0 of layer 0's `q_proj`, rounded onto the symmetric 4-bit
# grid: the scale is the largest magnitude over 7.5, each weight becomes the nearest integer in
# -8..7, and stands for that integer times the scale. Then the asymmetric grid, which slides by
# a zero point to cover the group's own range.

# %%
w = claims.weights()["model.layers.0.self_attn.q_proj"][0, :8].double()[None]
for symmetric in (True, False):
    deq, scale = quantize_group(w, 4, symmetric=symmetric)
    print("symmetric " if symmetric else "asymmetric", f"step {scale.item():.5f}")
    print("  weights  ", [f"{v:+.4f}" for v in w[0].tolist()])
    print("  stands for", [f"{v:+.4f}" for v in deq[0].tolist()])
    print(f"  largest error {(w - deq).abs().max().item() / scale.item():.3f} steps")

# %% [markdown]
# ## 2. Bytes
#
# What each scheme costs per weight (read from `QuantizedWeight.nbytes`), and what a decode
# token of SmolLM2-135M reads with every linear layer quantized and the tied head in bf16.

# %%
for name in ["bf16", *claims.SCHEMES]:
    if name == "w8a8":
        continue
    print(f"{name:28s} {claims.bytes_per_weight(name):.6f} bytes per weight")
for name in ("bf16", "w8a16 group 32", "w4a16 group 32"):
    print(f"{name:16s} {claims.decode_bytes(name) / 1e6:6.1f} MB per token, "
          f"ceiling {claims.ceiling(name):.2f}x, head {claims.head_share(name):.0%} of it")
print("linears groups of 128 divide:", claims.group_128_fits())

# %% [markdown]
# ## 3. The worst weight, and the divisor
#
# Round-to-nearest leaves every weight within half a step, up to float32's own rounding. With
# the divisor 8 instead of 7.5, the largest positive weight of a group is clamped a whole step.

# %%
print(f"largest error over every layer and scheme: {claims.worst_steps():.7f} steps")
for d in (7, 7.5, 8):
    worst, mse = claims.divisor_errors(d)
    print(f"divisor {d}: largest error {worst:.3f} steps, relative squared error {mse:.3%}")

# %% [markdown]
# ## 4. Group size and the zero point
#
# The relative squared error of the 24 layers with 256 inputs, 4-bit and 8-bit.

# %%
for bits in (4, 8):
    for sym in (True, False):
        row = ", ".join(f"{claims.relative_mse(bits, g, sym):.4%}" for g in claims.GROUPS)
        print(f"{bits}-bit {'symmetric ' if sym else 'asymmetric'}: {row}")
print("4-bit / 8-bit at group 32:", claims.mse_ratio_4_to_8(), "; (127.5 / 7.5)^2 =",
      (127.5 / 7.5) ** 2)

# %% [markdown]
# ## 5. An outlier
#
# One input of every row of layer 0's `q_proj` set to eight times the row's largest weight:
# how much the other weights' squared error grows.

# %%
growth = claims.outlier_growth()
print(f"per channel {growth[None]:.1f}x, group 32 {growth[32]:.1f}x")

# %% [markdown]
# ## 6. Packing, and the library's verdict
#
# Eight nibbles to a word, the first lowest; the frozen packer and the package's agree. Then every
# layer, written by `layer_tensors` under seven schemes, decompressed by compressed-tensors.

# %%
q = quantize_rtn(claims.weights()["model.layers.0.mlp.down_proj"], 4, 16).q
print("first row's first word:", hex(pack_nibbles(q[:1, :8])[0]),
      hex(pack_int32(q[:1, :8], 4).item() & 0xFFFFFFFF))
print("round trip:", torch.equal(unpack_int32(pack_int32(q, 4), 4, q.shape[1]), q))
print(claims.packed_shape())
print("equal to compressed-tensors' decompression:", claims.library_agrees())

# %% [markdown]
# ## 7. W8A8: one scale per token
#
# The inputs of each linear layer of block 0 while transformers runs nanoserve-tiny over held-out
# text: how far a token's largest feature stands above its typical one, and what rounding to int8
# costs it.

# %%
for name, (x, _) in list(claims.activations().items())[:7]:
    spike = x.abs().amax(-1) / x.pow(2).mean(-1).sqrt()
    q8, s = quantize_per_token(x)
    rel = (x - q8.float() * s).pow(2).mean(-1).sqrt() / x.pow(2).mean(-1).sqrt()
    print(f"{name.split('.', 3)[-1]:18s} largest / rms: median {spike.median():5.1f}, "
          f"max {spike.max():5.1f}; rounding error median {rel.median():.2%}")
e = claims.token_errors()
print(f"over {e['tokens']} token-inputs: median {e['median']:.2%}, worst {e['max']:.1%}; "
      f"output error: int8 weights {e['w8a16']:.2%}, int8 weights and inputs {e['w8a8']:.2%}")

# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 73 notebook: GPTQ against round-to-nearest
#
# Round-to-nearest rounds each weight alone. GPTQ rounds a layer's columns one at a time and
# pays each column's error back through the columns not yet rounded, weighted by how the inputs
# move together (the Hessian `H = 2 XᵀX / n`). This notebook runs the two-weight example by
# hand, captures one real layer's inputs and looks at its Hessian, quantizes that layer both
# ways, writes and loads a GPTQ checkpoint of the shipped model, and prints the reduced quality
# table beside the recorded full one. Nothing is timed; it runs in well under a minute on a CPU.

# %%
import json
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day73_gptq import claims
from chapters.day73_gptq.snapshot.obq import gptq_columns, output_error
from nanoserve.quantization.gptq import gptq
from nanoserve.quantization.rtn import quantize_rtn
from nanoserve.quantize.quality import relative_error

# %% [markdown]
# ## 1. Two weights, two correlated inputs
#
# Every rounding of the row on an integer grid, its squared output error `d H dᵀ`, and the one
# GPTQ picks: it rounds the first weight, moves the second by the first's error times the
# regression of one input on the other, then rounds the second.

# %%
H = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=torch.float64)
w = torch.tensor([[0.4, 0.4]], dtype=torch.float64)
for a in (0.0, 1.0):
    for b in (0.0, 1.0):
        d = w - torch.tensor([[a, b]], dtype=torch.float64)
        print(f"round to ({a:.0f}, {b:.0f}): squared output error {output_error(d, H):.3f}")
q, seen = gptq_columns(w, H, step=1.0)
print("round-to-nearest picks", torch.round(w).tolist(), "; GPTQ picks", q.tolist(),
      "; the second weight when it was rounded:", round(seen[0, 1].item(), 4))

# %% [markdown]
# ## 2. One real layer: layer 0's `qkv_proj`
#
# Its inputs on the calibration windows, captured with a forward hook. The input of layer 0 is a
# normalised embedding, so it depends on the token alone: the Hessian's rank is the number of
# distinct tokens seen.

# %%
x = claims.layer0_inputs()
print("calibration inputs", tuple(x["calibration"].shape), "other text", tuple(x["other"].shape))
for n in (64, 256, len(x["calibration"])):
    ids = claims.windows().flatten()[:n]
    print(f"{n:5d} tokens: {len(ids.unique()):4d} distinct, Hessian rank "
          f"{torch.linalg.matrix_rank(claims.hessian(x['calibration'][:n])).item()}")
Hc = claims.hessian(x["calibration"])
corr = Hc / torch.outer(Hc.diag().sqrt(), Hc.diag().sqrt())
off = corr[~torch.eye(256, dtype=torch.bool)].abs()
print(f"input correlations, off the diagonal: median {off.median():.2f}, "
      f"largest {off.max():.2f}")

# %% [markdown]
# ## 3. The same layer, both ways
#
# Output error relative to the output, on the calibration inputs and on other training text, at
# four bits with groups of 32; then the Cholesky rows against the inverse updated column by
# column, and lazy batches against one column at a time.

# %%
W = claims.layer0_weight()
Ho = claims.hessian(x["other"])
r = quantize_rtn(W, 4, 32).dequantize()
g = gptq(W, Hc, 4, 32).dequantize()
for name, h in (("calibration", Hc), ("other text", Ho)):
    print(f"{name:12s} RTN {relative_error(W, r, h):.4f}  GPTQ {relative_error(W, g, h):.4f}")
print(f"Cholesky rows against the updated inverse: {claims.cholesky_identity():.1e}")
print("integers that differ, blocks of 128 against one column at a time:",
      claims.lazy_batches())

# %% [markdown]
# ## 4. Damping and the number of calibration tokens
#
# GPTQ over RTN on the other text's inputs, calibrated on the first 64, 256 and 4,096 tokens,
# at several dampings. No damping on a singular Hessian fails.

# %%
print("no damping, 64 tokens:", claims.undamped())
for n in (64, 256, 4096):
    row = "  ".join(f"damp {d:g}: {claims.other_text_ratio(n, d):.2f}x"
                    for d in (0.001, 0.01, 0.1, 1.0, 10.0))
    print(f"{n:5d} tokens  {row}")

# %% [markdown]
# ## 5. A checkpoint, written and loaded
#
# `nanoserve quantize`'s own code writes the w4a16 GPTQ group 32 folder; the loader reads it back
# as any checkpoint. What the folder's config says, what stays dense, and what that costs.

# %%
path, quantized, errors = claims.folder("w4a16 GPTQ group 32")
qc = json.loads((path / "config.json").read_text())["quantization_config"]
print(json.dumps(qc["config_groups"]["group_0"]["weights"]))
print("ignore:", qc["ignore"])
print(f"dense down_proj's share of the decoder linears' bytes: {claims.dense_share():.0%}")
print("loaded folder against the dequantized weights in memory, largest logit difference:",
      f"{claims.loaded_and_memory()['logits']:.1e}")
for name, e in errors.items():
    print(f"{name:28s} RTN {e['rtn']:.4f}  GPTQ {e['gptq']:.4f}  ratio {e['gptq'] / e['rtn']:.3f}")

# %% [markdown]
# ## 6. Perplexity: the reduced rerun, and the recorded full table
#
# The rerun calibrates on the first half of the training topics and scores the first 16 windows
# of the second half and of the held-out split, each folder as the loader reads it. The recorded
# table calibrated on 128 windows of all the training text and scored every window.

# %%
for label in ("float32", "bf16", *claims.VARIANTS):
    p = claims.perplexities(label)
    print(f"{label:22s} training windows {p['training']:.4f}  held-out {p['held-out']:7.2f}")
for group in (128, 32):
    print(f"group {group}: GPTQ adds {claims.excess_ratio(group):.2f} of what RTN adds")

recorded = json.loads((ROOT / "chapters/day73_gptq/results" / claims.RESULTS).read_text())
print("\nrecorded:", recorded["machine"], recorded["date"])
for label in claims.RECORDED:
    train, held = recorded["values"][label]
    print(f"{label:24s} training text {train:.4f}  held-out {held:7.2f}")

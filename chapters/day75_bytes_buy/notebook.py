# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 75 notebook: what the bytes buy
#
# A decode step reads every weight once, so its bytes bound its speed. This notebook counts
# the bytes of a small random Llama in bf16 and at w4a16, checks that a Q4_0 GGUF written from
# the w4a16 folder holds the same weights in the same bytes, measures what rounding the
# activations to int8 blocks (llama.cpp's way) costs against widening the weight, times the
# two decodes, and reads the recorded comparison with llama.cpp. It runs in well under a minute
# on a CPU; the timed cell reads a clock, so its figures move from run to run.

# %%
import json
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day75_bytes_buy import claims
from chapters.day75_bytes_buy.snapshot.roofline import ceiling, fraction_of_ceiling, int8_blocks

# %% [markdown]
# ## 1. Bytes per step and the ceiling
#
# `step_bytes` counts what one decode step reads: each linear by `QuantizedWeight.nbytes`
# (integers and one scale per group) and the head (the embedding, tied). The ceiling is the
# ratio of the two totals.

# %%
for name in ("bf16", "w4a16"):
    b = claims.small_bytes(name)
    print(f"{name:6s} linears {b['linears'] / 1e6:6.1f} MB  head {b['head'] / 1e6:5.1f} MB  "
          f"total {b['total'] / 1e6:6.1f} MB")
print(f"byte ceiling, w4a16 over bf16: {claims.small_ceiling():.2f}x")
print(f"the head's share of a w4a16 step: "
      f"{claims.small_bytes('w4a16')['head'] / claims.small_bytes('w4a16')['total']:.0%}")

# %% [markdown]
# ## 2. Equal bytes, equal weights
#
# The w4a16 folder written as a Q4_0 GGUF from its own integers and scales, read back by the
# gguf package, compared with the checkpoint's dequantized weights.

# %%
g = claims.gguf_check()
print(f"linears equal after dequantizing: {g['same']} of {g['total']}")
print(f"their bytes: GGUF {g['file_bytes']:,}, QuantizedWeight.nbytes {g['nbytes']:,}")

# %% [markdown]
# ## 3. Widening the weight against rounding the activation
#
# One block of 32 activations rounded as Q8_0 does: its own scale, the largest magnitude over
# 127. Then the output error of a whole layer both ways.

# %%
x = torch.randn(1, 32, generator=torch.Generator().manual_seed(1))
print("largest rounding error in one block, in steps:",
      f"{((x - int8_blocks(x)).abs().max() / (x.abs().max() / 127)).item():.3f}")
e = claims.activation_errors()
print(f"nanoserve's kernel (bf16 activations): {e['widened']:.2%}")
print(f"activations in int8 blocks (Q8_0):     {e['int8']:.2%}")

# %% [markdown]
# ## 4. The rerun: decode speed, bf16 and w4a16, one thread
#
# Both folders loaded, pinned to one CPU, timed in interleaved rounds. A two-point fit of
# "time a token = fixed time + bytes / bandwidth" through the two arms says how much of a step
# the bytes do not explain (it assumes both arms stream at the same bandwidth, which a kernel
# at small shapes does not quite do, so read it as a rough split).

# %%
speeds = claims.decode_speeds()
for name, tps in speeds.items():
    print(f"{name:6s} {tps:7.1f} tokens/s")
ratio = speeds["w4a16"] / speeds["bf16"]
print(f"w4a16 / bf16: {ratio:.2f}x, {fraction_of_ceiling(ratio, claims.small_ceiling()):.0%} "
      f"of the ceiling")


def two_point(bytes_a, tps_a, bytes_b, tps_b):
    """Fixed seconds per token and bytes per second through two (bytes, tokens/s) points."""
    bw = (bytes_a - bytes_b) / (1 / tps_a - 1 / tps_b)
    return 1 / tps_a - bytes_a / bw, bw


fixed, bw = two_point(claims.small_bytes("bf16")["total"], speeds["bf16"],
                      claims.small_bytes("w4a16")["total"], speeds["w4a16"])
print(f"two-point fit: {fixed * 1e3:.2f} ms fixed per token ({fixed * speeds['bf16']:.0%} of a "
      f"bf16 step), weights streamed at {bw / 1e9:.0f} GB/s")

# %% [markdown]
# ## 5. The recorded comparison with llama.cpp
#
# From `results/quant-smollm2-135m.json`: the SmolLM2-135M shape, one request, 64 prompt and
# 128 new tokens, each arm's best round. Each engine's speed-up over its own bf16, the share of
# the byte ceiling that is, the ratio at equal bytes, and the same two-point fit per engine.

# %%
report = json.loads((claims.HERE / "results" / claims.RESULTS).read_text())
print(report["machine"], "|", report["date"], "|", report["command"])
sb = report["step_bytes"]
for r in report["rows"]:
    if not r.get("decode_tokens_per_s"):
        print(f"{r['arm']:18s} {r['threads']} thr  {r['status']}")
        continue
    extra = ""
    if r["weights"] != "bf16":
        extra = (f"  x bf16 {r['speedup_over_bf16']:.2f}  ceiling {r['byte_ceiling']:.2f}  "
                 f"share {r['fraction_of_ceiling']:.0%}")
    if r.get("ratio_over_llamacpp"):
        extra += f"  / llama.cpp {r['ratio_over_llamacpp']:.2f}x"
    print(f"{r['arm']:18s} {r['threads']} thr  {r['decode_tokens_per_s']:7.1f} tok/s{extra}")
by = {(r["engine"], r["weights"], r["threads"]): r for r in report["rows"]}
for engine in ("nanoserve", "llamacpp"):
    a, b = by.get((engine, "bf16", 1)), by.get((engine, "w4a16", 1))
    if a and b and a.get("decode_tokens_per_s") and b.get("decode_tokens_per_s"):
        fixed, bw = two_point(sb["bf16"]["total"], a["decode_tokens_per_s"],
                              sb["w4a16"]["total"], b["decode_tokens_per_s"])
        cap = ceiling(sb["bf16"]["total"], sb["w4a16"]["total"])
        print(f"{engine}: two-point fit {fixed * 1e3:.2f} ms fixed per token, "
              f"{bw / 1e9:.0f} GB/s; w4a16 ceiling {cap:.2f}x")

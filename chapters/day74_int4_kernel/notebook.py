# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 74 notebook: the int4 kernel
#
# The C++ kernel repacks an int4 weight into blocks of thirty-two outputs, widens each nibble
# with a shift and a table lookup, sums each group before applying its scale, and must equal
# dequantize-then-`F.linear` to float32 rounding. This notebook looks at the packed bytes,
# widens one lane by hand, reads integers back through the op, measures the error against the
# bound in each instruction set built here, and times one row. It runs in seconds on a CPU.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day74_int4_kernel import claims
from chapters.day74_int4_kernel.snapshot import nibbles
from nanoserve.cpu import quant_gemm as qg

why = qg.unavailable(4, torch.float32)
print("kernels:", why or f"built, instruction sets {qg.isas()}")

# %% [markdown]
# ## 1. Where one weight lives
#
# Pack a weight that is zero but for one entry with the C++ op, and find the byte that changed.
# The snapshot's `locate` says the same from the layout alone.

# %%
if not why:
    print("op:      ", claims.where_one_weight_lives(37, 13))
    print("snapshot:", "block {}, byte {}, shift {}".format(*nibbles.locate(37, 13, 576)))
    print("op's copy equal to the snapshot's pack:", claims.equal_to_snapshot(), "bytes")
    for what in ("int4 copy", "int8 copy", "streamed"):
        print(f"bytes per weight, {what}: {claims.bytes_per_weight(what):g}")

# %% [markdown]
# ## 2. One lane, widened by shift and table
#
# Output 0's lane of chunk 0 of a known weight: eight nibbles, in the order inputs
# 0, 2, 4, 6, 1, 3, 5, 7. Shifting right by 4p and looking the low four bits up in the table
# gives back the weights; compressed-tensors holds the same nibbles with the top bit flipped.

# %%
q = claims.known_weight()
word = nibbles.lane(nibbles.pack(q), 0, 0)
lanes = torch.tensor([word])
print(f"lane {word:#010x}")
print("row 0, inputs 0-7:     ", q[0, :8].tolist())
print("nibble p = 0..7 widened:", [int(nibbles.unpack_nibble(lanes, p)) for p in range(8)])
print("in input order:        ",
      [int(nibbles.unpack_nibble(lanes, nibbles.K_OF_P.index(i))) for i in range(8)])
if not why:
    print("top bit flipped against compressed-tensors:", claims.top_bit_flipped())

# %% [markdown]
# ## 3. Integers back through the op, and the error against the bound
#
# Times the identity, the kernel returns its integers exactly. On random weights the worst
# error, divided by the float32-rounding bound `2 (K + 8) 2^-24 mag`, per instruction set.

# %%
if not why:
    print("read back:", claims.read_back())
    print("float32 rows:", {k: f"{v:.4f}" for k, v in claims.kernel_error().items()})
    print("bf16 rows:   ", {k: f"{v:.4f}" for k, v in claims.kernel_error(torch.bfloat16).items()})
    print(f"W8A8:         {claims.w8a8_error():.4f}")

# %% [markdown]
# ## 4. The engine, and one row timed
#
# A random Llama quantized to int4 with zero points, served greedily with the kernel method and
# then the reference method. Then one bf16 row through copies of a 1536 x 576 weight, the int4
# kernel against the bf16 small-M kernel and against dequantizing first (microseconds a call;
# this machine, this moment).

# %%
if not why:
    print(claims.greedy_kernel_vs_reference())
    t = claims.one_row_times()
    print({k: f"{v * 1e6:.1f} us" for k, v in t.items()})
    print(f"bf16 / int4: {claims.over_int4('bf16'):.2f}x, "
          f"dequantize / int4: {claims.over_int4('dequantize'):.2f}x")

"""Compile every kernel configuration for an H200 on a machine without one.

Why this tool exists: the interpreter runs Python, so it accepts kernels the compiler rejects
(a ``tl.dot`` smaller than 16, a non-power-of-two ``tl.arange``, an int64/int32 mix in a loop).
This compiles each configuration the tests and the engine launch through Triton's own NVIDIA
backend, to a cubin (ptxas ships inside the triton wheel), for ``GPUTarget("cuda", 90, 32)``.
It builds a card's kernels, so it lives in ``tools/`` beside the other build scripts, not in the
runtime package. It needs the real compiler, so ``TRITON_INTERPRET=0`` must be set before
``nanoserve.cuda.kernels`` is imported (without CUDA that package refuses to guess a mode;
``nanoserve.cuda.triton_mode`` says why)::

    TRITON_INTERPRET=0 python -m tools.kernel_aot     # one line per configuration

``configurations()`` is also the tests' matrix, so importing this module under the interpreter
is fine; only compiling needs ``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from nanoserve.cuda.kernels.paged_attention import (
    MAX_SPLITS,
    MIN_DOT,
    _combine_kernel,
    _paged_attention_kernel,
    tile_tokens,
)


def _require_compiler() -> None:
    if not isinstance(_paged_attention_kernel, JITFunction):
        raise RuntimeError("the kernels were built for the interpreter; set TRITON_INTERPRET=0 "
                           "before nanoserve.cuda.kernels is imported")

H200 = GPUTarget("cuda", 90, 32)
_TY = {"float32": "fp32", "bfloat16": "bf16"}


@dataclass(frozen=True, slots=True)
class KernelConfig:
    dtype: str  # "float32" or "bfloat16"
    group: int  # query heads per KV head
    head_dim: int
    block_size: int
    tile: int  # the ``tile`` argument of paged_attention
    has_pos: bool  # prefill (causal horizons) or decode
    split: bool
    has_window: bool = False  # a sliding window (its size is a runtime argument)


GROUPS, HEAD_DIMS, BLOCK_SIZES = (1, 2, 5), (32, 48, 64), (1, 4, 16)
ENGINE_SHAPES = ((4, 8, 4), (2, 32, 4), (4, 64, 16), (4, 128, 16))  # (G, D, block_size)
WINDOWED_SHAPE = (4, 128, 16)  # Mistral-7B's decode: G 4, D 128, 16-token blocks, a window


def configurations(dtypes=tuple(_TY)) -> list[KernelConfig]:
    """Every configuration the tests and the engine launch, and so every one compiled here.

    The test matrix (G 1/2/5, D 32/48/64, block 1/4/16, 16-token tiles) is an orthogonal array:
    for each (dtype, split, prefill) combination, three (G, D, block) triples in which every
    value of each axis appears once, rotated across the combinations so that each pair of values
    of two axes meets somewhere. Then the engine's decode shapes (the tests' checkpoints: G 4
    D 8 and G 2 D 32 on 4-token blocks; Llama-3.2-1B and -3B: G 4, D 64 and D 128 on 16-token
    blocks) with the default 64-token tile, one-pass and split (the engine never prefills
    through the kernel). A sliding window is one more compiled variant (``HAS_WINDOW``): each
    (dtype, split, prefill) combination also compiles the k-th triple windowed, and the engine's
    windowed decode shape (``WINDOWED_SHAPE``) with the 64-token tile."""
    out = []
    combos = itertools.product(dtypes, (False, True), (False, True))
    for k, (dtype, split, has_pos) in enumerate(combos):
        for i in range(3):
            g, d, bs = GROUPS[i], HEAD_DIMS[(i + k) % 3], BLOCK_SIZES[(i + 2 * k) % 3]
            out.append(KernelConfig(dtype, g, d, bs, 16, has_pos, split))
        i = k % 3
        out.append(KernelConfig(dtype, GROUPS[i], HEAD_DIMS[(i + k) % 3],
                                BLOCK_SIZES[(i + 2 * k) % 3], 16, has_pos, split, True))
        if not has_pos:
            out += [KernelConfig(dtype, g, d, bs, 64, False, split) for g, d, bs in ENGINE_SHAPES]
            out.append(KernelConfig(dtype, *WINDOWED_SHAPE, 64, False, split, True))
    return out


def _pow2(n: int) -> int:
    return max(MIN_DOT, triton.next_power_of_2(n))


def compile_attention(c: KernelConfig, target: GPUTarget = H200):
    _require_compiler()
    ty = _TY[c.dtype]
    out_ty = "fp32" if c.split else ty
    sig = {"q_ptr": f"*{ty}", "k_ptr": f"*{ty}", "v_ptr": f"*{ty}", "bt_ptr": "*i64",
           "ctx_ptr": "*i64", "pos_ptr": "*i64", "out_ptr": f"*{out_ty}", "lse_ptr": "*fp32",
           "sm_scale": "fp32", "T": "i32", "seg_len": "i32", "window": "i32"}
    for name in _paged_attention_kernel.arg_names:
        if name.startswith("stride_"):
            sig[name] = "i32"
    const = dict(BLOCK_SIZE=c.block_size, G=c.group, G_PAD=_pow2(c.group), D=c.head_dim,
                 D_PAD=_pow2(c.head_dim), BLOCK_N=tile_tokens(c.block_size, c.tile),
                 HAS_POS=c.has_pos, HAS_WINDOW=c.has_window, SPLIT=c.split,
                 DOT_PRECISION="ieee" if c.dtype == "float32" else "tf32")
    sig.update(dict.fromkeys(const, "constexpr"))
    return triton.compile(ASTSource(_paged_attention_kernel, sig, const), target=target)


def compile_combine(dtype: str, head_dim: int, target: GPUTarget = H200):
    _require_compiler()
    sig = {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": f"*{_TY[dtype]}",
           "num_splits": "i32", "Hq": "i32", "T": "i32"}
    for name in _combine_kernel.arg_names:
        if name.startswith("stride_"):
            sig[name] = "i32"
    const = dict(D=head_dim, D_PAD=triton.next_power_of_2(head_dim), S_PAD=MAX_SPLITS)
    sig.update(dict.fromkeys(const, "constexpr"))
    return triton.compile(ASTSource(_combine_kernel, sig, const), target=target)


def combine_head_dims() -> list[int]:
    return sorted({*HEAD_DIMS, *(d for _, d, _ in ENGINE_SHAPES)})


def jobs() -> list[tuple[str, tuple]]:
    out = [("attention", (c,)) for c in configurations()]
    return out + [("combine", (dt, d)) for dt in _TY for d in combine_head_dims()]


def _run(job: tuple[str, tuple]) -> str:
    kind, args = job
    name = f"{kind}{args}"
    t0 = time.perf_counter()
    try:
        k = (compile_attention if kind == "attention" else compile_combine)(*args)
    except Exception as e:  # noqa: BLE001 - report every configuration, then fail
        first = str(e).splitlines()[0] if str(e) else ""
        return f"FAIL {name}: {type(e).__name__}: {first}"
    stages = ",".join(s for s in ("ttir", "ttgir", "llir", "ptx", "cubin") if s in k.asm)
    return f"ok   {time.perf_counter() - t0:5.2f}s  {stages}  {name}"


def main() -> int:
    """Compile every job, two processes at a time (compilation is single-threaded);
    ``--no-window``: only the configurations without a sliding window (Day 62's)."""
    todo = jobs()
    if "--no-window" in sys.argv[1:]:
        todo = [(kind, args) for kind, args in todo
                if not any(getattr(a, "has_window", False) for a in args)]
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        lines = list(pool.map(_run, todo))
    for line in lines:
        print(line)
    failed = sum(line.startswith("FAIL") for line in lines)
    print(f"{len(todo) - failed}/{len(todo)} compiled for {H200}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

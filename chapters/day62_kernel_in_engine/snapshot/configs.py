"""Day 62 snapshot (frozen): every kernel configuration the tests and the engine launch, and so
every one compiled for an H200 (``GPUTarget("cuda", 90, 32)``) on a machine without one.

The test matrix (G 1/2/5, head_dim 32/48/64, block 1/4/16, 16-token tiles) is an orthogonal
array: for each (dtype, split, prefill) combination, three (G, D, block) triples in which every
value of each axis appears once, rotated so that every pair of values of two axes meets. Then
the engine's decode shapes with the default 64-token tile, one-pass and split; and the merge
kernel once per (dtype, head_dim).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

DTYPES = ("float32", "bfloat16")
GROUPS, HEAD_DIMS, BLOCK_SIZES = (1, 2, 5), (32, 48, 64), (1, 4, 16)
ENGINE_SHAPES = ((4, 8, 4), (2, 32, 4), (4, 64, 16), (4, 128, 16))  # (G, D, block_size)


@dataclass(frozen=True, slots=True)
class KernelConfig:
    dtype: str
    group: int  # query heads per KV head
    head_dim: int
    block_size: int
    tile: int
    has_pos: bool  # prefill (causal horizons) or decode
    split: bool


def configurations(dtypes=DTYPES) -> list[KernelConfig]:
    out = []
    combos = itertools.product(dtypes, (False, True), (False, True))
    for k, (dtype, split, has_pos) in enumerate(combos):
        for i in range(3):
            g, d, bs = GROUPS[i], HEAD_DIMS[(i + k) % 3], BLOCK_SIZES[(i + 2 * k) % 3]
            out.append(KernelConfig(dtype, g, d, bs, 16, has_pos, split))
        if not has_pos:
            out += [KernelConfig(dtype, g, d, bs, 64, False, split) for g, d, bs in ENGINE_SHAPES]
    return out


def combine_head_dims() -> list[int]:
    return sorted({*HEAD_DIMS, *(d for _, d, _ in ENGINE_SHAPES)})


def jobs() -> list[tuple[str, tuple]]:
    out = [("attention", (c,)) for c in configurations()]
    return out + [("combine", (dt, d)) for dt in DTYPES for d in combine_head_dims()]

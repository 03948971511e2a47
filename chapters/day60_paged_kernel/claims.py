"""Day 60's numbers: the paged decode kernel against the reference, what it launches, and what
it materialises.

Errors are measured in float32 under Triton's interpreter (no GPU here) on tiny ragged shapes
with scattered block ids; launch grids are recorded from ``nanoserve.cuda.kernels.paged_attention``
itself (a recorder stands in for the kernel object, so a Llama-3.2-1B-sized shape can be
launched without running it); bytes come from ``nanoserve.attention.selector.workspace_bytes``.
"""

from __future__ import annotations

import functools
import importlib
import math

import torch

from chapters.runner import bound, exact

from .snapshot import online as snap

CONFIGS = ((1, 32, 1), (2, 48, 4), (5, 64, 16))  # (GQA group, head_dim, block_size)
KV_HEADS = 2
LLAMA = dict(num_q_heads=32, num_kv_heads=8, head_dim=64, dtype_bytes=2)  # Llama-3.2-1B, bf16


def kernels():
    """nanoserve.cuda.kernels, under the interpreter that chapters.runner chose on import."""
    return importlib.import_module("nanoserve.cuda.kernels")


def lens_for(block_size: int) -> list[int]:
    """Ragged: one token, about two blocks, several blocks and more than two 16-token tiles."""
    return [1, max(5, 2 * block_size - 3), max(37, 3 * block_size + 5)]


def case(lens, block_size, hkv, group, head_dim, seed=0, extra_width=2, poison=False,
         dtype=torch.float32):
    """Pools with scattered, out-of-order blocks; block tables with -1 past each row's end; the
    reference's (B, S) cell rectangle; queries (B, Hq, 1, D). Block 0 is never handed out, so
    it is what the reference's clamped -1 entries read. ``poison``: every cell outside every
    row's context holds NaN."""
    g = torch.Generator().manual_seed(seed)
    nblocks = [-(-n // block_size) for n in lens]
    pool_blocks = sum(nblocks) + 7
    ids = (torch.randperm(pool_blocks - 1, generator=g) + 1).tolist()
    tables = torch.full((len(lens), max(nblocks) + extra_width), -1, dtype=torch.long)
    cells = torch.full((len(lens), max(lens)), -1, dtype=torch.long)
    for r, (n, nb) in enumerate(zip(lens, nblocks, strict=True)):
        tables[r, :nb] = torch.tensor(ids[:nb])
        ids = ids[nb:]
        p = torch.arange(n)
        cells[r, :n] = tables[r, p // block_size] * block_size + p % block_size
    shape = (pool_blocks * block_size, hkv, head_dim)
    k, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    if poison:
        unused = torch.ones(shape[0], dtype=torch.bool)
        unused[cells[cells >= 0]] = False
        k[unused] = v[unused] = math.nan
    q = torch.randn(len(lens), hkv * group, 1, head_dim, generator=g)
    ctx = torch.tensor(lens)
    return [t.to(dtype) if t.is_floating_point() else t for t in (q, k, v)] + [tables, cells, ctx]


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def reference(q, k, v, cells, ctx):
    from nanoserve.attention.reference import paged_attention_batched_reference

    return paged_attention_batched_reference(q.float(), k.float(), v.float(), cells,
                                             ctx[:, None] - 1, ctx)


@functools.cache
def measured(group: int, head_dim: int, block_size: int) -> tuple[float, float]:
    """(kernel vs reference, snapshot vs kernel): max relative errors, one pass, 16-token tiles."""
    q, k, v, tables, cells, ctx = case(lens_for(block_size), block_size, KV_HEADS, group,
                                       head_dim)
    out = kernels().paged_attention(q, k, v, tables, ctx, block_size, splits=1, tile=16)
    mine = snap.paged_attention_online(q, k, v, tables, ctx, block_size, tile=16)
    return rel(out, reference(q, k, v, cells, ctx)), rel(mine, out)


def snapshot_worst() -> float:
    return max(measured(*c)[1] for c in CONFIGS)


def adapter_error() -> float:
    q, k, v, tables, cells, ctx = case([3, 17, 9], 4, KV_HEADS, 2, 32)
    out = kernels().paged_attention_triton(q, k, v, cells, ctx[:, None] - 1, ctx)
    return rel(out, reference(q, k, v, cells, ctx))


@torch.inference_mode()
def cells_the_kernel_reads(blocks: list[int], length: int, block_size: int) -> list[int]:
    """The pool cells the kernel reads for one row, in position order, observed in its output
    rather than computed from the addressing formula. Every K is zero, so every position the
    kernel loads gets the same weight, and every cell's V is the one-hot of its own index, so the
    output is the average of the one-hots of exactly the cells it loaded. Run at contexts 1, 2,
    ..., ``length``: the cell that appears at context n is the one position n - 1 reads."""
    cells = (max(blocks) + 1) * block_size
    width = 1 << (cells - 1).bit_length()  # head_dim: a power of two, one lane per cell
    k = torch.zeros(cells, 1, width)
    v = torch.eye(cells, width)[:, None, :]  # (cells, Hkv=1, D): V[c] = one-hot(c)
    q = torch.zeros(1, 1, 1, width)
    table = torch.tensor([blocks + [-1]])  # -1 past the row's end, as the engine leaves it
    order, seen = [], set()
    for n in range(1, length + 1):
        out = kernels().paged_attention(q, k, v, table, torch.tensor([n]), block_size,
                                        splits=1, tile=16)[0, 0, 0]
        read = {int(c) for c in torch.nonzero(out > 0.5 / n).flatten()}
        new = read - seen
        if len(read) != n or len(new) != 1:
            raise AssertionError(f"context {n}: the kernel read cells {sorted(read)}")
        order += new
        seen = read
    return order


@functools.cache
def row_72() -> list[int]:
    """The claims' row: blocks [7, 2], context 6, 4-token blocks."""
    return cells_the_kernel_reads([7, 2], 6, 4)


def poisoned() -> str:
    """NaN in every pool cell no row owns: which outputs does each path spoil?"""
    q, k, v, tables, cells, ctx = case([3, 9, 14], 4, KV_HEADS, 2, 32, poison=True)
    out = kernels().paged_attention(q, k, v, tables, ctx, 4, splits=1, tile=16)
    ref = reference(q, k, v, cells, ctx)
    bad = [int((~torch.isfinite(o).flatten(1).all(1)).sum()) for o in (out, ref)]
    return f"{bad[0]} of {len(ctx)} / {bad[1]} of {len(ctx)}"


class Launches:
    """Record every launch of the two Triton kernels (grid, constexprs, the segment length) by
    standing in for the kernel objects inside nanoserve.cuda.kernels.paged_attention; with
    ``run=False`` nothing executes, so a full-size shape costs only its allocations.

    >>> with Launches(run=False) as log:           # doctest: +SKIP
    ...     paged_attention(q, k, v, tables, ctx, 16)
    >>> log.grids()                                # doctest: +SKIP
    [('attention', (64, 8, 1))]
    """

    def __init__(self, run: bool = True):
        self.run, self.log = run, []

    def __enter__(self) -> Launches:
        kernels()
        self.mod = importlib.import_module("nanoserve.cuda.kernels.paged_attention")
        self.saved = self.mod._paged_attention_kernel, self.mod._combine_kernel
        self.mod._paged_attention_kernel = _Recorder("attention", self.saved[0], self)
        self.mod._combine_kernel = _Recorder("combine", self.saved[1], self)
        return self

    def __exit__(self, *exc):
        self.mod._paged_attention_kernel, self.mod._combine_kernel = self.saved

    def grids(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, grid) for name, grid, *_ in self.log]


class _Recorder:
    def __init__(self, name, kernel, launches):
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            seg = args[10] if self.name == "attention" else None
            self.launches.log.append((self.name, tuple(grid), constexprs, seg, args))
            if self.launches.run:
                return self.kernel[grid](*args, **constexprs)
        return launch


def llama_inputs(lens: tuple[int, ...], head_dim: int = 64, block_size: int = 16):
    """Llama-3.2-1B's attention shape (32 query heads, 8 KV heads) over rows of ``lens`` tokens
    in ``block_size``-token blocks, the table as wide as the longest row: a one-block pool (the
    grid does not depend on the pool)."""
    W = -(-max(lens) // block_size)
    q = torch.zeros(len(lens), 32, 1, head_dim)
    pool = torch.zeros(block_size, 8, head_dim)
    return q, pool, pool, torch.zeros(len(lens), W, dtype=torch.long), torch.tensor(lens)


@functools.cache
def launch_lens(lens: tuple[int, ...], head_dim: int = 64, splits: int | None = None):
    """Every launch paged_attention makes for this shape, recorded and not run."""
    with Launches(run=False) as rec:
        kernels().paged_attention(*llama_inputs(lens, head_dim), 16, splits=splits)
    return rec.log


def llama_launch(rows: int, ctx: int, head_dim: int = 64, splits: int | None = None):
    return launch_lens((ctx,) * rows, head_dim, splits)


def grid_text(rows: int, ctx: int) -> str:
    (name, grid, *_), *_ = llama_launch(rows, ctx)
    return f"{' × '.join(map(str, grid))} = {math.prod(grid):,} programs"


def packing() -> str:
    (_, _, c, *_), *_ = llama_launch(64, 1024)
    return f"{c['G']} of {c['G_PAD']}"


def head_dim_48() -> str:
    (_, _, c, *_), *_ = llama_launch(64, 1024, head_dim=48)
    return f"{c['D']} of {c['D_PAD']}"


def workspace(path: str, lens: list[int], **over) -> int:
    from nanoserve.attention.selector import workspace_bytes

    return workspace_bytes(path, lens, **{**LLAMA, **over})


def three_paths() -> str:
    lens = [1024] * 64
    return " / ".join(f"{workspace(p, lens):,}" for p in ("reference", "gathered", "triton"))


def score_rectangle() -> str:
    """The reference's float32 score rectangle, priced by workspace_bytes itself: the same
    call with no query heads prices everything but the scores."""
    lens = [1024] * 64
    return f"{workspace('reference', lens) - workspace('reference', lens, num_q_heads=0):,}"


def err_label(g: int, d: int, bs: int) -> str:
    return (f"kernel vs reference, max relative error: GQA {g}, head_dim {d}, "
            f"{bs}-token blocks")


CLAIMS = [
    *(bound(err_label(*c), functools.partial(lambda c: measured(*c)[0], c),
            fmt="{:.1e}".format) for c in CONFIGS),
    bound("frozen snapshot (plain torch) vs the kernel, worst of the three", snapshot_worst,
          fmt="{:.1e}".format),
    bound("`paged_attention_triton` (the reference's signature) vs the reference",
          adapter_error, fmt="{:.1e}".format),
    exact("blocks [7, 2], context 6, 4-token blocks: cells the kernel reads, in position order "
          "(seen in its output)",
          lambda: ", ".join(map(str, row_72()))),
    exact("the snapshot's addressing for the same row (`cells_of`), against the kernel's reads",
          lambda: "identical" if snap.cells_of([7, 2], 6, 4) == row_72() else "differs"),
    exact("NaN in every pool cell no row owns: rows with a non-finite output, kernel / reference",
          poisoned),
    exact("Llama-3.2-1B attention, 64 rows × 1,024 tokens: launch grid (rows × KV heads × "
          "segments)", lambda: grid_text(64, 1024)),
    exact("GQA packing, Llama-3.2-1B: query heads per program, of the tile's rows", packing),
    exact("head_dim 48: lanes holding data, of the padded width", head_dim_48),
    exact("workspace bytes, one layer, 64 rows × 1,024 tokens, bf16: reference / gathered / "
          "kernel", three_paths),
    exact("of the reference's: the float32 score rectangle (64, 32, 1, 1,024)", score_rectangle),
]

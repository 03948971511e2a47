"""Day 61's numbers: which shapes split and into how many segments, split-K against one pass,
the merge, and the bytes the partials cost.

Segment counts are read from the launch grid that ``nanoserve.cuda.kernels.paged_attention`` builds
(recorded, not run, for Llama-3.2-1B-sized shapes); errors are float32 under Triton's
interpreter on tiny shapes; bytes come from ``workspace_bytes`` and from the partial tensors a
recorded launch allocates.
"""

from __future__ import annotations

import functools
import itertools

import torch

from chapters.day60_paged_kernel.claims import (
    CONFIGS,
    KV_HEADS,
    Launches,
    case,
    kernels,
    launch_lens,
    lens_for,
    reference,
    rel,
    workspace,
)
from chapters.runner import bound, exact

from .snapshot import split_k as snap

SHAPES = {  # label -> the rows' context lengths (Llama-3.2-1B attention, 16-token blocks)
    "1 row × 4,096": (4096,),
    "8 rows × 1,024": (1024,) * 8,
    "64 rows × 1,024": (1024,) * 64,
    "2 rows × 32,768": (32768,) * 2,
    "ragged 100 / 700 / 2,000 / 4,000": (100, 700, 2000, 4000),
}


def segments(lens: tuple[int, ...]) -> str:
    (_, grid, _, seg, _), *_ = launch_lens(lens)
    return "1 (one pass)" if grid[2] == 1 else f"{grid[2]} × {seg:,}"


def programs(lens: tuple[int, ...]) -> str:
    log = launch_lens(lens)
    count = {name: 0 for name in ("attention", "combine")}
    for name, grid, *_ in log:
        count[name] += grid[0] * grid[1] * grid[2] if len(grid) == 3 else grid[0]
    return f"{count['attention']:,} + {count['combine']:,}"


def same_shape_paths() -> str:
    """Four rows, a 256-block table; the contexts inside it change, the rule's input does not."""
    sets = [(1, 1, 1, 1), (4096,) * 4, (100, 700, 2000, 4000), (17, 4000, 3, 256), (2048,) * 4]
    paths = set()
    for lens in sets:
        q, k, v, _, ctx = _llama(lens)
        with Launches(run=False) as rec:
            kernels().paged_attention(q, k, v, torch.zeros(4, 256, dtype=torch.long), ctx, 16)
        paths.add(tuple(rec.log[0][1]) + (rec.log[0][3],))
    return f"{len(paths)} path for {len(sets)} context sets" if len(paths) == 1 else \
        f"{len(paths)} paths for {len(sets)} context sets"


def _llama(lens):
    from chapters.day60_paged_kernel.claims import llama_inputs

    return llama_inputs(lens)


def eager_growth(capacity: int | None = None) -> str:
    """One row decoding from 1 to 4,096 tokens. Eager: the table is as wide as the row needs
    (ceil(ctx / 16) blocks). Captured: the table is the buffer's width, ``capacity`` tokens."""
    choose = kernels().choose_splits
    paths = {choose(1, 8, capacity or -(-ctx // 16) * 16, 64) for ctx in range(1, 4097)}
    return f"{len(paths)}"


@functools.cache
def split_errors() -> tuple[float, float, float]:
    """Worst over the day-60 configurations: split (3 segments) vs one pass, split vs the
    reference, the snapshot's split + merge vs the kernel's."""
    worst = [0.0, 0.0, 0.0]
    for g, d, bs in CONFIGS:
        q, k, v, tables, cells, ctx = case(lens_for(bs), bs, KV_HEADS, g, d)
        split = kernels().paged_attention(q, k, v, tables, ctx, bs, splits=3, tile=16)
        one = kernels().paged_attention(q, k, v, tables, ctx, bs, splits=1, tile=16)
        mine, _, _ = snap.split_attention(q, k, v, tables, ctx, bs, 3, tile=16)
        errs = rel(split, one), rel(split, reference(q, k, v, cells, ctx)), rel(mine, split)
        worst = [max(a, b) for a, b in zip(worst, errs, strict=True)]
    return tuple(worst)


def empty_segments() -> float:
    q, k, v, tables, cells, ctx = case([1], 4, 1, 2, 32, extra_width=5)
    return rel(kernels().paged_attention(q, k, v, tables, ctx, 4, splits=4, tile=16),
               reference(q, k, v, cells, ctx))


@functools.cache
def rule_run() -> tuple[int, float]:
    """The rule's own choice on a shape small enough for the interpreter: 1 row of 600 tokens,
    2 KV heads, GQA 4, head_dim 64, 16-token blocks, the default 64-token tile."""
    q, k, v, tables, cells, ctx = case([600], 16, 2, 4, 64, extra_width=0)
    with Launches() as rec:
        out = kernels().paged_attention(q, k, v, tables, ctx, 16)
    return rec.log[0][1][2], rel(out, reference(q, k, v, cells, ctx))


def merge_exact() -> float:
    """The merge on its own (snapshot): a row's 1,000 scores cut in 3 uneven pieces, each
    piece's normalised output and LSE, merged, against one softmax over the row (float64)."""
    g = torch.Generator().manual_seed(61)
    s = torch.randn(1, 1000, generator=g, dtype=torch.float64) * 4  # (G=1, n) base-2 scores
    v = torch.randn(1000, 8, generator=g, dtype=torch.float64)
    whole = torch.softmax(s * torch.log(torch.tensor(2.0, dtype=torch.float64)), -1) @ v
    parts, lses = [], []
    for lo, hi in ((0, 137), (137, 800), (800, 1000)):
        piece = s[:, lo:hi]
        top = piece.amax(1)
        p = torch.exp2(piece - top[:, None])
        parts.append(p @ v[lo:hi] / p.sum(1)[:, None])
        lses.append(top + torch.log2(p.sum(1)))
    merged = snap.merge(torch.stack(parts), torch.stack(lses))
    return ((merged - whole).abs().max() / whole.abs().max()).item()


def rule_agrees() -> str:
    shapes = list(itertools.product((1, 2, 4, 8, 16, 33, 64), (1, 8), (64, 1000, 4096, 32768),
                                    (16, 64)))
    same = sum(snap.choose_splits(*s) == kernels().choose_splits(*s) for s in shapes)
    return f"{same} of {len(shapes)}"


def bytes_row(lens: tuple[int, ...]) -> str:
    return " / ".join(f"{workspace(p, list(lens)):,}" for p in ("reference", "gathered", "triton"))


def partial_bytes() -> str:
    """8 rows × 1,024: the block-id table alone (one pass forced) and what split-K adds, as
    workspace_bytes prices it and as the recorded launch actually allocated."""
    from nanoserve.cuda.kernels import workspace_bytes

    lens = (1024,) * 8
    table = workspace_bytes(8, 32, 8, 64, 64, 16, splits=1)
    priced = workspace_bytes(8, 32, 8, 64, 64, 16) - table
    (_, _, _, _, args), _ = launch_lens(lens)
    part, lse = args[6], args[7]  # the float32 partial outputs and LSEs handed to the kernel
    held = part.numel() * part.element_size() + lse.numel() * lse.element_size()
    return f"{table:,} / {priced:,} (allocated: {held:,})"


CLAIMS = [
    *(exact(f"segments × tokens each, {label}", functools.partial(segments, lens))
      for label, lens in SHAPES.items()),
    exact("programs launched, 8 rows × 1,024: attention + merge",
          lambda: programs(SHAPES["8 rows × 1,024"])),
    exact("programs launched, 1 row × 4,096; 64 rows × 1,024; 2 rows × 32,768: attention + "
          "merge", lambda: "; ".join(programs(SHAPES[k]) for k in
                                      ("1 row × 4,096", "64 rows × 1,024", "2 rows × 32,768"))),
    exact("4 rows in a 256-block table, five different sets of contexts: paths taken",
          same_shape_paths),
    exact("1 row decoding from 1 to 4,096 tokens, eager (table as wide as the row needs): "
          "distinct paths", eager_growth),
    exact("the same row, captured (table as wide as max_model_len 4,096): distinct paths",
          lambda: eager_growth(4096)),
    exact("the frozen rule vs the package's, over a grid of shapes", rule_agrees),
    bound("split-K (3 segments) vs one pass, max relative error, worst of three "
          "configurations", lambda: split_errors()[0], fmt="{:.1e}".format),
    bound("split-K (3 segments) vs the reference, worst of three configurations",
          lambda: split_errors()[1], fmt="{:.1e}".format),
    bound("a 1-token row in 4 segments (3 of them empty) vs the reference", empty_segments,
          fmt="{:.1e}".format),
    exact("the rule's own choice, 1 row × 600 tokens, 2 KV heads: segments",
          lambda: rule_run()[0]),
    bound("that run vs the reference, max relative error", lambda: rule_run()[1],
          fmt="{:.1e}".format),
    bound("frozen snapshot's split + merge vs the kernel's, worst of three",
          lambda: split_errors()[2], fmt="{:.1e}".format),
    bound("LSE merge of 3 uneven pieces vs one softmax over 1,000 scores (float64)",
          merge_exact, fmt="{:.1e}".format),
    *(exact(f"workspace bytes, {label}: reference / gathered / kernel",
            functools.partial(bytes_row, SHAPES[label]))
      for label in ("8 rows × 1,024", "1 row × 4,096", "ragged 100 / 700 / 2,000 / 4,000")),
    exact("8 rows × 1,024, kernel: block ids / partials and LSEs", partial_bytes),
]

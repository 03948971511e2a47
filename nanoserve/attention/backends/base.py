"""``AttentionBackend``: one way of reading the paged cache, behind the interface every way shares.

Why this module exists: where a step's K and V live is the paged cache's business
(``nanoserve.attention.paged``); how a step *reads* them is a choice, and each choice has its own
metadata (a rectangle of cells, Day 50's gathered chunks, a block table for a kernel). Each read
path is one subclass in its own file, chosen once at load (``nanoserve.attention.selector``), so
the cache never asks which one it has and a new path is a new file, not a branch in every other.

A backend states what it can serve as data, and ``unsupported`` holds a model's needs
(``AttentionSpec``) against it: the first thing missing is the refusal's reason.

The cache calls three hooks, and the model's forward reaches the fourth through it:

- ``plan(step, rows, ctx, cells)`` in ``begin_step``: the backend's part of the step's layout
  (``step.read``, and ``step.read_cells`` where the rectangle is needed);
- ``read(layer, q, k, v, positions, step)``: the context read, once the step's K/V are in their
  cells. A step comes in one of three layouts (``StepLayout.kind``): ``decode`` (one new token per
  row), ``padded`` (Day 27's (B, T) rectangle, read as a rectangle by every backend) and
  ``packed`` (a (1, N) stream: fresh prompts, continued chunks and, under chunked prefill, decode
  rows, walked in runs by ``mixed``);
- ``forget_row(row)``: a row's cells changed other than by growing (reset, moved, a prefix adopted);
- ``kernel_decode(step)``: the block table of a decode step, for the fused C++ forward's layer loop.

Graph windows (``nanoserve.cuda.graphs``) replay decode over static buffers and ask the backend
for that read too (``window_read``); ``window_chunk`` says whether they keep a gathered mapping.

Shapes: B rows, Hq query heads, Hkv KV heads, T new tokens per row, N packed tokens, D head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from nanoserve.attention.causal import packed_prefill_attention
from nanoserve.attention.reference import paged_attention_batched_reference

if TYPE_CHECKING:
    from nanoserve.attention.paged import BatchedPagedKVCache, StepLayout
    from nanoserve.config import ModelConfig


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """What a model asks of attention, held against a backend once, at load."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: str = "cpu"  # a device type: "cpu" or "cuda"
    sliding_window: int | None = None  # some layer attends to its last N positions only
    logit_softcap: float | None = None  # scores pass through cap * tanh(score / cap)

    @classmethod
    def for_model(cls, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str,
                  windows: tuple[int | None, ...] = ()) -> AttentionSpec:
        """``windows``: each layer's sliding window as the family reads it (a Qwen config may
        write a ``sliding_window`` that no layer uses); the widest is what a backend must
        serve."""
        widest = max((w for w in windows if w is not None), default=None)
        return cls(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, dtype,
                   torch.device(device).type, widest, cfg.attn_logit_softcapping)


class AttentionBackend:
    """The shared read paths; a subclass overrides what its own read does differently."""

    name: ClassVar[str] = "base"
    # What it can serve, as data (``unsupported`` reads these).
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    sliding_window: ClassVar[bool] = False  # a per-layer window on every read path
    logit_softcap: ClassVar[bool] = False
    # The rows its own read takes: "decode" (one token per row), "prefill" (prompt tokens).
    # What it does not take goes through the shared paths below.
    reads: ClassVar[tuple[str, ...]] = ()
    # Fresh prompts attend to their own new keys, not through the pool (Day 51).
    packs_fresh_prompts: ClassVar[bool] = True
    # Its decode read takes one row at several positions in one step (a verify step, Day 76:
    # each proposal a decode row over the same blocks); a read keyed by row cannot.
    repeats_rows: ClassVar[bool] = False
    # A graph window of this backend keeps Day 50's gathered mapping, this many cells a chunk.
    window_chunk: ClassVar[int | None] = None

    def __init__(self, cache: BatchedPagedKVCache):
        self.cache = cache
        # each layer's sliding window (None: full attention); ``read`` sets ``window``
        self.windows: tuple[int | None, ...] = tuple(getattr(cache, "windows", ()) or ())
        self.window: int | None = None

    # ------------------------------------------------------------------ what it serves

    @classmethod
    def unsupported(cls, spec: AttentionSpec) -> str | None:
        """The first thing ``spec`` needs that this backend lacks, or None."""
        if spec.device not in cls.devices:
            return f"device {spec.device} (it runs on {', '.join(cls.devices)})"
        if spec.dtype not in cls.dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in cls.dtypes)
            return f"dtype {str(spec.dtype).removeprefix('torch.')} (it takes {names})"
        if spec.sliding_window is not None and not cls.sliding_window:
            return f"a sliding window of {spec.sliding_window} tokens"
        if spec.logit_softcap is not None and not cls.logit_softcap:
            return f"a logit soft-cap of {spec.logit_softcap}"
        return cls.shape_problem(spec)

    @classmethod
    def describe(cls) -> str:
        """What this backend's own read takes, for the load log."""
        own = " and ".join(cls.reads) or "no rows of its own"
        return f"{cls.name}: its own read takes {own}; the shared paths the rest"

    @classmethod
    def shape_problem(cls, spec: AttentionSpec) -> str | None:
        """A head shape this backend cannot read, or None (any shape, by default)."""
        return None

    @classmethod
    def prepare_process(cls) -> None:
        """Whatever the process must settle before the model is built (Triton's mode)."""

    @classmethod
    def workspace_bytes(cls, context_lens: list[int], num_q_heads: int, num_kv_heads: int,
                        head_dim: int, dtype_bytes: int, chunk: int = 32,
                        block_size: int = 16) -> int:
        """Bytes of the intermediate tensors one layer's decode read materialises."""
        raise ValueError(f"the {cls.name!r} read's workspace is not priced")

    # ------------------------------------------------------------------ the cache's hooks

    def forget_row(self, row: int) -> None:
        """Row ``row``'s cells changed other than by growing: drop what was kept for it."""

    def plan(self, step: StepLayout, rows: list[int], ctx: list[int],
             cells: torch.Tensor) -> None:
        """The backend's part of ``begin_step``; ``cells`` are the new tokens' cells."""
        slots = self.cache.slots.cells
        if step.kind == "decode":
            self.plan_decode(step, rows, ctx, cells)
        elif step.kind == "packed" and (not self.packs_fresh_prompts or any(step.starts)):
            step.read_cells = slots[rows, :max(ctx)]  # (B, S): continued rows read the pool

    def plan_decode(self, step: StepLayout, rows: list[int], ctx: list[int],
                    cells: torch.Tensor) -> None:
        step.read_cells = self.cache.slots.cells[rows, :max(ctx)]  # (B, S): the rectangle

    def block_ids(self, rows: list[int], ctx: list[int]) -> torch.Tensor:
        """(B, W) block ids per row, -1 past each row's end: a block's first cell // bs."""
        bs = self.cache.block_size
        return (self.cache.slots.cells[rows, ::bs][:, :-(-max(ctx) // bs)] // bs).contiguous()

    def kernel_decode(self, step: StepLayout) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(block table (B, W), context lens (B,)) when this decode step can be read by the C++
        layer loop (``decode_layers``), else None."""
        return None

    # ------------------------------------------------------------------ the read

    def read(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             positions: torch.Tensor, step: StepLayout) -> torch.Tensor:
        """q (B, Hq, T, D), k/v (B, Hkv, T, D) already written -> (B, Hq, T, D)."""
        kp, vp = self.cache.k[layer], self.cache.v[layer]  # (cells, Hkv, D)
        self.window = self.windows[layer] if self.windows else None
        if step.kind == "decode":
            return self.decode(q, kp, vp, positions, step)
        if step.kind == "padded":
            return paged_attention_batched_reference(q, kp, vp, step.read_cells, positions,
                                                     step.context_lens, self.window)
        if step.read_cells is None:  # every prompt starts at 0: its keys are the new ones
            return self.prompts(q, k, v, kp, vp, step, 0, len(step.packed_lens), 0)
        return self.mixed(q, k, v, kp, vp, positions, step)

    def decode(self, q, kp, vp, positions, step: StepLayout) -> torch.Tensor:
        """One token per row, q (B, Hq, 1, D): Day 28's (B, S) rectangle."""
        return paged_attention_batched_reference(q, kp, vp, step.read_cells, positions,
                                                 step.context_lens, self.window)

    def prompts(self, q, k, v, kp, vp, step: StepLayout, b: int, e: int,
                s: int) -> torch.Tensor:
        """Fresh prompts ``b .. e-1`` of a packed step, tokens ``s ..`` of its stream, each
        attending to itself (through this layer's window, where it has one): q (1, Hq, n, D)
        over their own new k/v (1, Hkv, n, D)."""
        return packed_prefill_attention(q, k, v, step.packed_lens[b:e], self.window)

    def rows(self, qd, kp, vp, positions, step: StepLayout, b: int, e: int) -> torch.Tensor:
        """Rows ``b .. e-1`` of a packed step, one token each (decodes riding along):
        qd (m, Hq, 1, D), positions (m, 1) -> (m, Hq, 1, D), one batched read."""
        ctx = max(step.ctx[b:e])
        return paged_attention_batched_reference(qd, kp, vp, step.read_cells[b:e, :ctx],
                                                 positions, step.context_lens[b:e], self.window)

    def chunk(self, q, kp, vp, positions, step: StepLayout, b: int, s: int) -> torch.Tensor:
        """Row ``b``'s continued chunk (a later part of a long prompt, or a prompt after a
        prefix hit): its new queries q (1, Hq, n, D) over everything its row holds."""
        return paged_attention_batched_reference(q, kp, vp, step.read_cells[b:b + 1, :step.ctx[b]],
                                                 positions, step.context_lens[b:b + 1],
                                                self.window)

    def mixed(self, q, k, v, kp, vp, positions, step: StepLayout) -> torch.Tensor:
        """A packed stream whose rows do not all start empty (Day 41): runs of fresh prompts
        (``prompts``), runs of one-token rows (``rows``), and continued chunks (``chunk``).
        q (1, Hq, N, D) -> (1, Hq, N, D)."""
        out, lens, starts = torch.empty_like(q), step.packed_lens, step.starts
        b, s, B = 0, 0, len(lens)
        while b < B:
            e = b + 1
            if starts[b] == 0 and self.packs_fresh_prompts:
                while e < B and starts[e] == 0:
                    e += 1
                n = sum(lens[b:e])
                out[:, :, s:s + n] = self.prompts(q[:, :, s:s + n], k[:, :, s:s + n],
                                                  v[:, :, s:s + n], kp, vp, step, b, e, s)
            elif lens[b] == 1:
                while e < B and lens[e] == 1 and starts[e] > 0:
                    e += 1
                n = e - b
                qd = q[0, :, s:s + n].transpose(0, 1)[:, :, None]  # (m, Hq, 1, D)
                got = self.rows(qd, kp, vp, positions[0, s:s + n, None], step, b, e)
                out[0, :, s:s + n] = got[:, :, 0].transpose(0, 1)
            else:
                n = lens[b]
                out[:, :, s:s + n] = self.chunk(q[:, :, s:s + n], kp, vp,
                                                positions[:, s:s + n], step, b, s)
            s += n
            b = e
        return out

    def window_read(self, q, kp, vp, slot_cells, positions, context_lens,
                    gathered: tuple[torch.Tensor, ...] | None = None,
                    window: int | None = None) -> torch.Tensor:
        """A graph window's decode read over its static buffers: q (b, Hq, 1, D), the first
        ``b`` rows of the slot table (b, L) -> (b, Hq, 1, D), through the layer's sliding
        ``window`` where it has one (masked by position, as every rectangle read is)."""
        return paged_attention_batched_reference(q, kp, vp, slot_cells, positions, context_lens,
                                                 window)

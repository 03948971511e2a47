"""Day 49 snapshot (frozen): the decode forward through ``torch.compile``, one graph per bucket.

A decode step at a small batch is a long list of small operations per layer, each a Python
call and a dispatch in eager mode. ``torch.compile`` traces the forward once and hands the
graph to a backend (inductor writes and builds C++ on a CPU). Two inputs would make it trace
again on every step, and both are kept out of its sight:

- the batch size: a step of B rows is padded up to a bucket (``decode_buckets``), and the graph
  is specialised per bucket (``dynamic=False``), so a run compiles at most once per bucket;
- the context length, which grows every step: the attention read is the custom op
  ``day49::paged_attend``, whose fake says only "shaped like q". Inside it the cache's own
  ``attend`` runs eagerly on the real rows, so no shape of the read ever reaches a guard.

    >>> decode_buckets(12)
    [1, 2, 4, 8, 12]

``compiles`` counts graphs built and ``warmup_s`` is the wall time of the calls that built
them, so a measurement can leave the warm-up out and still say what it cost.
"""

from __future__ import annotations

import shutil
import threading
import time

import torch

_ACTIVE = threading.local()  # .cache, .rows: the call in flight on this thread


@torch.library.custom_op("day49::paged_attend", mutates_args=())
def paged_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                 layer: int) -> torch.Tensor:
    """q (Bp, Hq, 1, D), k/v (Bp, Hkv, 1, D), positions (Bp, 1) -> (Bp, Hq, 1, D): the active
    cache's attend for the B real rows, zeros for the bucket's pad rows."""
    cache, B = _ACTIVE.cache, _ACTIVE.rows
    out = torch.zeros_like(q)
    out[:B] = cache.attend(layer, q[:B], k[:B], v[:B], positions[:B])
    return out


@paged_attend.register_fake
def _(q, k, v, positions, layer):
    return torch.empty_like(q)


class _Opaque:
    """The attention backend the traced forward sees: one custom-op call per layer."""

    def attend(self, layer, q, k, v, positions):
        return torch.ops.day49.paged_attend(q, k, v, positions, layer)


def decode_buckets(max_num_seqs: int) -> list[int]:
    """Powers of two below max_num_seqs, then max_num_seqs itself."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


def inductor_unavailable() -> str | None:
    """Why inductor's CPU backend cannot build here, or None if it can."""
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "inductor's CPU backend needs a C++ compiler (g++/clang++); none is on PATH"
    return None


class CompiledDecode:
    """``__call__(ids, pos, cache)`` -> logits (B, V) for one decode step of B real rows; the
    caller has already run ``cache.begin_step`` for those rows."""

    def __init__(self, model, max_num_seqs: int, backend: str = "inductor"):
        why = inductor_unavailable() if backend == "inductor" else None
        if why is not None:
            raise RuntimeError(f"compile refused: {why}")
        self.backend = backend
        self.buckets = decode_buckets(max_num_seqs)
        self.compiles = 0  # graphs built: at most one per bucket
        self.warmup_s = 0.0  # wall time of the calls that built them
        self.calls = 0
        self.padded_rows = 0  # pad rows computed, summed over calls
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, len(self.buckets) + 2)
        shim = _Opaque()

        def forward(ids, pos):  # (Bp, 1) each -> logits (Bp, V)
            return model.compute_logits(model(ids, pos, shim)[:, -1])

        self._fn = torch.compile(forward, backend=self._build, dynamic=False, fullgraph=True)

    def _build(self, gm, example_inputs):
        self.compiles += 1
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        return torch._dynamo.lookup_backend(self.backend)(gm, example_inputs)

    def bucket(self, B: int) -> int:
        return next(b for b in self.buckets if b >= B)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
        B = ids.shape[0]
        Bp = self.bucket(B)
        if Bp > B:  # pad rows: token 0 at position 0, never written, sliced away below
            pad = torch.zeros(Bp - B, 1, dtype=ids.dtype, device=ids.device)
            ids, pos = torch.cat([ids, pad]), torch.cat([pos, pad])
        _ACTIVE.cache, _ACTIVE.rows = cache, B
        before, t0 = self.compiles, time.perf_counter()
        try:
            logits = self._fn(ids, pos)
        finally:
            _ACTIVE.cache, _ACTIVE.rows = None, 0
        if self.compiles > before:
            self.warmup_s += time.perf_counter() - t0
        self.calls += 1
        self.padded_rows += Bp - B
        return logits[:B]


@torch.inference_mode()
def compiled_decode(compiled: CompiledDecode, cache, rows: list[int],
                    tokens: list[int]) -> torch.Tensor:
    """One decode step over a paged cache (Day 17's, or any with begin_step/attend/end_step):
    one token per row -> next-token logits (B, V). Day 28's step, through the compiled forward."""
    ids = torch.tensor(tokens, dtype=torch.long)[:, None]  # (B, 1)
    pos = torch.tensor([[cache.lengths[r]] for r in rows], dtype=torch.long)  # (B, 1)
    cache.begin_step(rows, [1] * len(rows))
    try:
        return compiled(ids, pos, cache)
    finally:
        cache.end_step()

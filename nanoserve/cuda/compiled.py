"""Compiled decode (Day 49): the decode forward through ``torch.compile``, recompiled per bucket.

Why this module exists: a decode step at small batch is dozens of small kernels per layer, and
in eager mode each one is a Python call and a dispatch. ``torch.compile`` (inductor; on a CPU it
writes C++ and builds it with the system compiler) fuses the norms, the rotary embedding, the
SwiGLU and the residual adds into a few loops. Two things would make it recompile every step:

- the batch size. Decode batches are padded up to a *bucket* (1, 2, 4, 8, ... max_num_seqs: the
  rule in ``nanoserve.cuda.buckets``, shared with Day 57's windows), and the graph is specialised
  per bucket (``dynamic=False``), so a running batch compiles at most once per bucket.
  ``CompiledDecode.compiles`` counts compilations; tests bound it by the number of buckets.
- the context length, which grows every step. The attention read is opaque to the compiler: a
  ``torch.library`` custom op, ``nanoserve::paged_attend``, whose fake implementation says only
  "the output is shaped like q". Inside it the cache's ``attend`` runs eagerly on the real rows
  (the pad rows get zeros and are never written), so the gathered mapping and the reference read
  both work unchanged and nothing of their varying shapes reaches a guard.

Warm-up is not hidden: ``warmup_s`` is the wall time of the calls that compiled, and each
compilation is logged. Where inductor cannot build (no C++ compiler), ``CompiledDecode`` refuses
at construction with the reason, rather than silently running eager.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import threading
import time
import types

import torch

from nanoserve.cuda.buckets import (
    batch_buckets as decode_buckets,  # Day 49's name: [1, 2, 4, 8, 12] for 12
)

log = logging.getLogger("nanoserve")

_INSTANCES = itertools.count()  # names each instance's copy of the decode code object
_ACTIVE = threading.local()  # .cache, .rows: the call in flight on this thread


@torch.library.custom_op("nanoserve::paged_attend", mutates_args=())
def paged_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                 layer: int) -> torch.Tensor:
    """The cache's attend for the real rows; zeros for the bucket's pad rows.

    q (Bp, Hq, 1, D), k/v (Bp, Hkv, 1, D), positions (Bp, 1) -> (Bp, Hq, 1, D). Writes the real
    rows' K/V into the active cache's pools: a side effect the compiler never sees, ordered by
    the data dependence from one layer to the next."""
    cache, B = _ACTIVE.cache, _ACTIVE.rows
    out = torch.zeros_like(q)
    out[:B] = cache.attend(layer, q[:B], k[:B], v[:B], positions[:B])
    return out


@paged_attend.register_fake
def _(q, k, v, positions, layer):
    return torch.empty_like(q)


class _Opaque:
    """The attention backend the compiled graph sees: one custom-op call per layer."""

    def attend(self, layer, q, k, v, positions):
        return torch.ops.nanoserve.paged_attend(q, k, v, positions, layer)


def inductor_unavailable() -> str | None:
    """Why inductor's CPU backend cannot build here, or None if it can."""
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "inductor's CPU backend needs a C++ compiler (g++/clang++); none is on PATH"
    return None


class CompiledDecode:
    """``__call__(ids, pos, cache, B)`` -> logits (B, V) for one decode step of B real rows."""

    def __init__(self, model, max_num_seqs: int, backend: str = "inductor"):
        why = inductor_unavailable() if backend == "inductor" else None
        if why is not None:
            raise RuntimeError(f"compile=True refused: {why}. Run with compile=False.")
        self.backend = backend  # "inductor"; tests also use "aot_eager" (no C++ build)
        self.buckets = decode_buckets(max_num_seqs)
        self.compiles = 0  # graphs inductor built: at most one per bucket
        self.warmup_s = 0.0  # wall time of the calls that compiled
        self.calls = 0
        self.padded_rows = 0  # pad rows computed, summed over calls
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, len(self.buckets) + 2)
        shim = _Opaque()

        def forward(ids, pos):  # (Bp, 1) each -> logits (Bp, V)
            return model.compute_logits(model(ids, pos, shim)[:, -1])

        # Dynamo keys its cache and its recompile limit on the code object, and every instance's
        # ``forward`` shares one: a third compiled engine in a process would find the limit spent
        # by the first two. A copy of the code object per instance keeps their counts apart.
        code = forward.__code__.replace(co_name=f"decode_forward_{next(_INSTANCES)}")
        forward = types.FunctionType(code, forward.__globals__, code.co_name,
                                     forward.__defaults__, forward.__closure__)
        self.fn = torch.compile(forward, backend=self._inductor, dynamic=False, fullgraph=True)

    def _inductor(self, gm, example_inputs):
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
            logits = self.fn(ids, pos)
        finally:
            _ACTIVE.cache, _ACTIVE.rows = None, 0
        if self.compiles > before:
            spent = time.perf_counter() - t0
            self.warmup_s += spent
            log.info("compiled decode for batch bucket %d in %.1f s (%d graph(s) so far)", Bp,
                     spent, self.compiles)
        self.calls += 1
        self.padded_rows += Bp - B
        return logits[:B]

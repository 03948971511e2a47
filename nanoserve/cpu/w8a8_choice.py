"""Which batches W8A8's int8 kernel takes: measured against the path it would otherwise run.

Why this module exists: a W8A8 linear has two ways to compute a batch. The int8 kernel
(``int8_gemm``) quantizes each row to int8 and multiplies int8 by int8 (VNNI where the CPU has
it); the other path rounds the rows to int8 and back, dequantizes the weight into a scratch
buffer and runs ``F.linear`` in the activations' dtype (oneDNN; AMX tiles on a CPU that has
them). Both give the reference's numbers; which is faster depends on the processor and the
batch, so neither is assumed: each distinct shape is timed at the row counts the weight-only
kernels are timed at (``quant_gemm.ROWS``, up to a 512-token prompt), and the int8 kernel takes
every batch up to the largest row count where it is not slower, stopping at the first loss.
Measured on an AMD EPYC (Zen 5, AVX-512 VNNI and AVX512-BF16, no AMX), one thread, bf16 rows:
the fallback does all of ``F.linear``'s work and more, and the int8 kernel matched or beat
bf16 ``F.linear`` alone at 64 and 512 rows on SmolLM2-135M's shapes. The verdict is cached with
the weight-only kernels' in ``build/quant_gemm.json``.

    rows = choose_int8(N, K, torch.bfloat16)     # 0: never; ALL_ROWS: every batch
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from nanoserve.cpu import csrc, quant_gemm
from nanoserve.cpu.measured import best_interleaved, cache_dir, cached, machine_key


def measure_int8(N: int, K: int, dtype: torch.dtype, rows: tuple[int, ...]) -> dict[int, float]:
    """Fallback time / int8 kernel time at each row count, on a random int8 weight."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, generator=g) / 64 + 1e-3  # (N,)
    packed, buf = quant_gemm.pack_int8(q), torch.empty(N, K, dtype=dtype)
    ratios = {}
    for m in rows:
        x = torch.randn(m, K, generator=g).to(dtype)

        def fallback(x=x):
            xq, sx = _per_token(x)
            torch.mul(q, scale[:, None], out=buf) if dtype == torch.float32 else \
                buf.copy_(q * scale[:, None])
            return F.linear((xq * sx).to(dtype), buf)

        best = best_interleaved([functools.partial(quant_gemm.int8_gemm, x, packed, scale, None,
                                                   N), fallback], quant_gemm.REPS,
                                quant_gemm.BUDGET_S)
        ratios[m] = best[1] / best[0]
    return ratios


def _per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows rounded to int8 per token (rtn.quantize_per_token's arithmetic; this package may
    not import it): the values, still float32, and each row's scale."""
    xf = x.to(torch.float32)
    s = xf.abs().amax(-1, keepdim=True) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.round(xf / s).clamp(-128, 127), s


def choose_int8(N: int, K: int, dtype: torch.dtype) -> int:
    """The largest batch the int8 kernel takes (0: none; ``ALL_ROWS``: every batch)."""
    if quant_gemm.unavailable(8, dtype):
        return 0
    rows = quant_gemm.ROWS
    key = (f"{machine_key()}|{N}x{K}|w8a8|{str(dtype).removeprefix('torch.')}"
           f"|rows {','.join(map(str, rows))}|ops {csrc.build_key()}")

    def verdict() -> dict:
        ratios = measure_int8(N, K, dtype, rows)
        return {"rows": quant_gemm.rows_won(ratios),
                "fallback_over_kernel": {str(m): round(r, 3) for m, r in ratios.items()}}
    return int(cached("quant_gemm.json", key, verdict, cache_dir() / "quant_gemm.json")["rows"])

"""Quantized linears on a CPU: the C++ kernels' Python face, and which batches they take.

Why this module exists: a decode step reads every weight once, so int4 and int8 weights are
only worth their fewer bytes if a kernel streams them without first widening them in memory.
``csrc/quant_gemm.cpp`` does that for weight-only schemes (int4 or int8 weights, group scales and
zero points, float32 or bf16 activations, AVX-512 or AVX2 + FMA), and ``csrc/int8_gemm.cpp`` for
W8A8 (activations rounded to int8 per token inside the call, int8 dot products by AVX-512 VNNI,
else AVX2 ``madd``). Past a few hundred rows a blocked GEMM on a dequantized copy wins (the
kernel re-streams the weight for every 8 rows); ``choose`` finds the crossing for each shape by
measurement and caches it per machine in ``build/quant_gemm.json``, as ``small_gemm.choose``
does. ``dequantize_into`` writes the packed weight out in float32 or bf16 for that path
(bit-equal to ``QuantizedWeight.dequantize`` in float32), so the unpacked integers need not be
kept: for 1536 x 576 to bf16 it took 187 us (int4) and 484 us (int8, a strided gather) where
``QuantizedWeight.dequantize`` from the unpacked integers took 198 and 169 us.

Measured on a 2-core AMD EPYC (Zen 5, family 26: AVX-512 with VNNI and BF16, no AMX), one
thread, bf16 rows, group 32, the fused SmolLM2-135M shapes, ``python -m nanoserve.cpu.quant_gemm
--cold-mb 256`` (copies cycled so the weights come from memory, as in a model's decode step;
us per call through this module's Python wrappers, the bf16 small-M kernel first, scales bf16
from ``pack_scales``; the byte ceiling against bf16 is 3.56x for int4 and 1.88x for int8;
medians of 4 runs interleaved with the previous kernels on a machine shared with other jobs,
load average about 3, so about 10% of noise):

    N x K         M=1: bf16 / int8 / int4              M=8: bf16 / int8 / int4
    960 x 576     33.8 / 19.8 (1.70x) / 12.6 (2.67x)   37.5 / 30.9 (1.21x) / 25.4 (1.47x)
    576 x 576     20.5 / 13.2 (1.55x) /  8.7 (2.38x)   22.0 / 20.6 (1.07x) / 16.9 (1.30x)
    3072 x 576    96.9 / 50.4 (1.92x) / 27.8 (3.49x)   107  / 88.5 (1.21x) / 71.0 (1.51x)
    576 x 1536    52.5 / 28.5 (1.84x) / 16.9 (3.11x)   54.1 / 48.1 (1.12x) / 38.1 (1.42x)
    49152 x 576   1455 / 739  (1.97x) / 362  (4.02x)   1392 / 1244 (1.12x) / 1031 (1.35x)

(the previous kernels, 8 dot-product chains at one row: int4 at M=1 2.51x, 1.99x, 3.08x, 2.94x,
3.77x). In checkpoint bytes per second at one row int4 streams 0.67-0.98x as fast as the bf16
kernel on the four layer shapes (0.75-1.03x called as the op, without the Python wrapper's 1.5
us); the int4 LM head, 16 MB, partly fits the 32 MB L3 across calls: hence past the ceiling.
The small shapes pay a fixed 2-3 us a call (576 x 576 int4 is 0.19 MB): a 32 x 32 call took
1.7 us as the op (small_gemm's 0.95: most of it the dispatcher unboxing nine arguments) and 1.5
us more through ``gemm``, neither paid by a caller in C++. At 8 rows the
kernels are bound by dot products, not bytes (as many per weight as the bf16 kernel's, plus the
widening: ``csrc/quant_gemm_avx512.h`` has the counts). ``choose`` found the kernel faster than
dequantize-then-``F.linear`` up to 256 rows on every (unfused) SmolLM2 shape (1.04-1.17x at
256, 0.91-0.99x at 512), and at every batch for the LM head. W8A8 at prefill sizes against
bf16 ``F.linear`` (oneDNN), one thread: 1.19-1.29x at 64 rows, 0.80-1.10x at 512
(torch._int_mm with PyTorch's quantization: 0.78-1.29x and 0.81-1.44x).

    packed = pack(q, bits=4)                                     # q (N, K) int8, at load
    scale_p, zero_p = pack_scales(scale, zero)                   # at load too (optional)
    y = gemm(x, packed, scale_p, zero_p, 4, 32, bias, N)         # x (..., K) -> (..., N)
    p8 = pack_int8(q8); y = int8_gemm(x, p8, w_scale, bias, N)   # W8A8
    rows = choose(N, K, 4, 32, torch.bfloat16)                   # the kernel for <= rows
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
import torch.nn.functional as F

from nanoserve.cpu import csrc
from nanoserve.cpu.measured import best_interleaved, cache_dir, cached, machine_key
from nanoserve.cpu.small_gemm import ALL_ROWS  # the verdict "every batch", as small_gemm's

ISAS = ("auto", "avx512", "avx2")
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # batches choose() times, up to a long prompt
REPS = 7
BUDGET_S = 0.5  # per timed batch size

def unavailable(bits: int, dtype: torch.dtype) -> str | None:
    """Why the weight-only kernel cannot run here for ``bits``-bit weights and ``dtype`` rows,
    or None. (Shapes are checked per call: int4 needs groups of a multiple of 8 inputs.)"""
    if bits not in (4, 8):
        return f"no kernel for {bits}-bit weights (4 or 8)"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"the quantized kernels take float32 or bfloat16 activations, not {dtype}"
    if why := csrc.load():
        return why
    if not torch.ops.nanoserve.quant_gemm_available("auto"):
        return "the C++ ops were built without AVX-512 or AVX2 with FMA"
    return None


def isas() -> list[str]:
    """The instruction sets the kernels can be forced to here (tests run each)."""
    if csrc.load():
        return []
    return [i for i in ISAS[1:] if torch.ops.nanoserve.quant_gemm_available(i)]


def shape_unsupported(K: int, bits: int, group_size: int) -> str | None:
    """Why a (N, K) weight in groups of ``group_size`` cannot take the kernel, or None."""
    if group_size < 1 or K % group_size:
        return f"group_size {group_size} does not divide K={K}"
    if bits == 4 and group_size % 8:
        return f"int4 groups must be a multiple of 8 inputs, got {group_size}"
    return None


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q (N, K) int8, signed ``bits``-bit values -> the kernel's packed copy (made once)."""
    return _op("pack_quant_weight")(q, bits)


def pack_scales(scale: torch.Tensor, zero: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """scale (N, G) float32 or bf16 and zero (N, G) int8 or None -> the kernel's (N/32, G, 32)
    copies (scale in its own dtype: bf16 stays two bytes a group; zero as float32), made once at
    load: ``gemm`` takes these in place of the (N, G) tensors, which it would otherwise
    transpose block by block on every call (a quarter of an int4 g32 call's time)."""
    N, G = scale.shape
    pad = -N % 32

    def blocked(t: torch.Tensor) -> torch.Tensor:
        t = F.pad(t, (0, 0, 0, pad))  # (N + pad, G), zero rows
        return t.view(-1, 32, G).transpose(1, 2).contiguous()  # (Nb, G, 32)
    if scale.dtype not in (torch.float32, torch.bfloat16):
        scale = scale.float()
    return blocked(scale), None if zero is None else blocked(zero.float())


_OPS: dict[str, object] = {}


def _op(name: str):
    """torch.ops.nanoserve.<name>.default, looked up once (the lookup costs a microsecond)."""
    if name not in _OPS:
        if why := csrc.load():
            raise RuntimeError(f"the quantized kernels are unavailable: {why}")
        _OPS[name] = getattr(torch.ops.nanoserve, name).default
    return _OPS[name]


def gemm(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
         zero: torch.Tensor | None, bits: int, group_size: int, bias: torch.Tensor | None,
         out_features: int, isa: str = "auto") -> torch.Tensor:
    """x (..., K) float32 or bf16 -> (..., N) in x's dtype; scale (N, G) float32 or bf16 and
    zero (N, G) int8 or None, or both from ``pack_scales`` (faster); bias (N,) in x's dtype."""
    if x.dim() == 2 and x.stride(1) == 1:
        out = torch.empty((x.shape[0], out_features), dtype=x.dtype)
        _op("quant_gemm")(out, x, packed, scale, zero, bits, group_size, bias, isa)
        return out
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (M, K)
    out = torch.empty((x2.shape[0], out_features), dtype=x.dtype)
    _op("quant_gemm")(out, x2, packed, scale, zero, bits, group_size, bias, isa)
    return out.view(*x.shape[:-1], out_features)


def dequantize_into(buf: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                    zero: torch.Tensor | None, bits: int, group_size: int) -> torch.Tensor:
    """The packed weight written out into ``buf`` (N, K) float32 or bf16; returns ``buf``."""
    _op("dequantize_into")(buf, packed, scale, zero, bits, group_size)
    return buf


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """W8A8: q (N, K) int8 -> the packed copy int8_gemm reads (with per-column sums)."""
    return _op("pack_int8_weight")(q)


def int8_gemm(x: torch.Tensor, packed: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None, out_features: int, isa: str = "auto") -> torch.Tensor:
    """W8A8: x (..., K) float32 or bf16, quantized per token inside; w_scale (N,) float32."""
    x2 = x.reshape(-1, x.shape[-1])  # (M, K)
    out = torch.empty((x2.shape[0], out_features), dtype=x.dtype)
    _op("int8_gemm")(out, x2, packed, w_scale, bias, isa)
    return out.view(*x.shape[:-1], out_features)


def _random_weight(N: int, K: int, bits: int, group_size: int, g: torch.Generator):
    hi = (1 << (bits - 1)) - 1
    q = torch.randint(-hi - 1, hi + 1, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, K // group_size, generator=g) / 64 + 1e-3
    return q, scale


def measure(N: int, K: int, bits: int, group_size: int, dtype: torch.dtype,
            rows: tuple[int, ...] = ROWS) -> dict[int, float]:
    """(dequantize_into + F.linear) time / kernel time at each row count, random weights."""
    g = torch.Generator().manual_seed(0)
    q, scale = _random_weight(N, K, bits, group_size, g)
    packed, buf = pack(q, bits), torch.empty(N, K, dtype=dtype)
    blocked = pack_scales(scale, None)[0]
    ratios = {}
    for m in rows:
        x = torch.randn(m, K, generator=g).to(dtype)

        def other(x=x):
            return F.linear(x, dequantize_into(buf, packed, scale, None, bits, group_size))

        best = best_interleaved([functools.partial(gemm, x, packed, blocked, None, bits,
                                                   group_size, None, N), other], REPS, BUDGET_S)
        ratios[m] = best[1] / best[0]
    return ratios


def rows_won(ratios: dict[int, float]) -> int:
    """The largest row count, in increasing order, up to which every ratio (other path's time
    over the kernel's) is at least 1; ``ALL_ROWS`` when the kernel won at the largest."""
    best, rows = 0, sorted(ratios)
    for m in rows:
        if ratios[m] < 1.0:
            break
        best = ALL_ROWS if m == rows[-1] else m
    return best


def choose(N: int, K: int, bits: int, group_size: int, dtype: torch.dtype) -> int:
    """The largest batch the kernel takes (0: none; ``ALL_ROWS``: every batch): the largest
    timed row count at which it beats dequantize-into-a-buffer then ``F.linear``, stopping at
    the first loss. Cached per machine, shape, bits, group, dtype and build of the kernels."""
    if unavailable(bits, dtype) or shape_unsupported(K, bits, group_size):
        return 0
    key = (f"{machine_key()}|{N}x{K}|int{bits} g{group_size}|{str(dtype).removeprefix('torch.')}"
           f"|rows {','.join(map(str, ROWS))}|ops {csrc.build_key()}")

    def verdict() -> dict:
        ratios = measure(N, K, bits, group_size, dtype)
        return {"rows": rows_won(ratios), "linear_over_kernel": {str(m): round(r, 3)
                                                                 for m, r in ratios.items()}}
    return int(cached("quant_gemm.json", key, verdict, cache_dir() / "quant_gemm.json")["rows"])


# SmolLM2-135M (N, K): fused qkv, o_proj, fused gate_up, down, the LM head
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576))


def _timed(fn, *args, reps: int = 30) -> float:
    call = functools.partial(fn, *args)
    call()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def _small_gemm(x: torch.Tensor, small: torch.Tensor, N: int) -> torch.Tensor:
    out = torch.empty((x.shape[0], N), dtype=x.dtype)  # as gemm() does: a fair comparison
    _op("small_gemm")(out, x, small, None)
    return out


def _cycle(fn, args_per_copy: list[tuple], reps: int) -> float:
    """Seconds per call, calling ``fn`` on each copy's arguments in turn (best of ``reps``
    rounds), so that with enough copies every weight comes from memory, not from cache."""
    fn(*args_per_copy[0])
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for args in args_per_copy:
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / len(args_per_copy))
    return best


def bench_decode(rows: tuple[int, ...], isa: str, cold_mb: int = 0) -> None:
    """us per call and GB/s of the int8 and int4 g32 kernels (bf16 rows, bf16 scales as
    pack_scales' bf16 copies; GB/s counts the checkpoint's bytes: bits/8 per weight and a
    bf16 scale per group) against the bf16 small-M kernel on the same shapes. ``cold_mb``: cycle
    through enough copies of each weight that the bf16 ones fill that many MB (more than the
    last-level cache: the weights stream from memory, as a model's do in a decode step)."""
    g = torch.Generator().manual_seed(0)
    print(f"{'N x K':>12} {'M':>2} | {'bf16 us':>8} {'GB/s':>5} | {'int8 us':>8} {'GB/s':>5} "
          f"{'x bf16':>6} | {'int4 us':>8} {'GB/s':>5} {'x bf16':>6}")
    for N, K in SHAPES:
        copies = max(1, -(-cold_mb * 2**20 // (2 * N * K)))
        small = [torch.ops.nanoserve.pack_small_gemm(torch.randn(N, K, generator=g)
                                                     .to(torch.bfloat16)) for _ in range(copies)]
        quant = {}
        for b in (8, 4):
            q, s = _random_weight(N, K, b, 32, g)
            s16 = s.to(torch.bfloat16)
            quant[b] = ([(pack(q, b), pack_scales(s16, None)[0]) for _ in range(copies)],
                        q.numel() * b // 8 + 2 * s.numel())
        reps = 5 if copies > 1 else 30
        for m in rows:
            x = torch.randn(m, K, generator=g).to(torch.bfloat16)
            t16 = _cycle(_small_gemm, [(x, w, N) for w in small], reps)
            line = f"{N:>6} x {K:<4} {m:>2} | {t16 * 1e6:8.1f} {2 * N * K / t16 / 1e9:5.1f} |"
            for b in (8, 4):
                packs, nbytes = quant[b]
                t = _cycle(gemm, [(x, p, s, None, b, 32, None, N, isa) for p, s in packs], reps)
                line += f" {t * 1e6:8.1f} {nbytes / t / 1e9:5.1f} {t16 / t:5.2f}x |"
            print(line.rstrip(" |"))


def _int_mm_w8a8(x: torch.Tensor, qt: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """W8A8 through oneDNN's s8s8 torch._int_mm, the per-token quantization in PyTorch."""
    xf = x.float()
    s = xf.abs().amax(-1, keepdim=True) / 127
    xq = torch.round(xf / s).clamp(-128, 127).to(torch.int8)
    return (torch._int_mm(xq, qt).float() * s * ws).to(x.dtype)


def _dequantized_linear(x, buf, packed, scale, bits):
    return F.linear(x, dequantize_into(buf, packed, scale, None, bits, 32))


def bench_prefill(rows: tuple[int, ...]) -> None:
    """us per call at prefill sizes, bf16 rows: F.linear on a bf16 weight (oneDNN) and on
    float32; W8A8 by the kernel and by torch._int_mm; int4 g32 dequantized into a bf16 buffer
    then F.linear (the weight-only prefill path)."""
    g = torch.Generator().manual_seed(0)
    print(f"{'N x K':>12} {'M':>4} | {'bf16':>7} {'f32':>7} {'w8a8':>7} {'_int_mm':>7} "
          f"{'int4 dq':>7} | {'bf16/w8a8':>9} {'bf16/_int_mm':>12} {'bf16/int4':>9}")
    for N, K in SHAPES[:4]:
        w = torch.randn(N, K, generator=g)
        w16 = w.to(torch.bfloat16)
        q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
        ws = torch.rand(N, generator=g) / 100
        packed, qt = pack_int8(q), q.t().contiguous()
        q4, s4 = _random_weight(N, K, 4, 32, g)
        p4, buf = pack(q4, 4), torch.empty(N, K, dtype=torch.bfloat16)
        for m in rows:
            x = torch.randn(m, K, generator=g)
            x16 = x.to(torch.bfloat16)
            t16 = _timed(F.linear, x16, w16, reps=10)
            t32 = _timed(F.linear, x, w, reps=10)
            t8 = _timed(int8_gemm, x16, packed, ws, None, N, reps=10)
            tmm = _timed(_int_mm_w8a8, x16, qt, ws, reps=10)
            t4 = _timed(_dequantized_linear, x16, buf, p4, s4, 4, reps=10)
            print(f"{N:>6} x {K:<4} {m:>4} | {t16 * 1e6:7.0f} {t32 * 1e6:7.0f} {t8 * 1e6:7.0f} "
                  f"{tmm * 1e6:7.0f} {t4 * 1e6:7.0f} | {t16 / t8:8.2f}x {t16 / tmm:11.2f}x "
                  f"{t16 / t4:8.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--isa", default="auto", choices=ISAS)
    ap.add_argument("--prefill", action="store_true", help="prefill rows (64, 512) instead")
    ap.add_argument("--cold-mb", type=int, default=0,
                    help="cycle through copies of each weight filling this many MB of bf16")
    args = ap.parse_args(argv)
    if why := unavailable(4, torch.bfloat16):
        print(f"quantized kernels unavailable: {why}")
        return 1
    torch.set_num_threads(args.threads)
    print(f"{csrc.cpu_model()}, {args.threads} thread(s), isa {args.isa}")
    if args.prefill:
        bench_prefill((64, 512))
    else:
        bench_decode((1, 2, 4, 8), args.isa, args.cold_mb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Day 74's numbers: the int4 kernel's layout, its agreement with dequantize-then-F.linear, and
what streaming nibbles buys at one row.

The layout rows read the C++ op's own packed copy (``nanoserve.cpu.quant_gemm.pack``) byte by
byte and hold it against the frozen snapshot's ``pack`` and against compressed-tensors'
int32 words (``nanoserve.quantization.packing``). The error rows run the C++ kernels, forced to
each instruction set this CPU has, on random shapes, group sizes, zero points and scales
(seeded), and divide each output's error against ``QuantizedWeight.dequantize`` then
``F.linear`` in float32 by the float32-rounding bound the tests use. The engine row serves a
random Llama checkpoint written by transformers and quantized by ``nanoserve quantize`` (w4a16,
group 32, asymmetric), greedy, with the kernel method and then with the reference method. The
timed rows run one bf16 row through 128 copies of a 1536 x 576 weight in turn (the int4 copies
alone fill 64 MB, more than a last-level cache), one thread, in interleaved rounds; they run
only in ``make chapter-74`` and the book build.
"""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from chapters.common import best_of, hf_checkpoint
from chapters.runner import bound, exact, timed

from .snapshot import nibbles

N_SHAPE, K_SHAPE = 1536, 576  # SmolLM2-135M's gate_proj / up_proj
EPS = 2.0 ** -24
CASES = 40  # random weights per error row
COPIES = 128  # weights cycled by the timed rows


def qg():
    from nanoserve.cpu import quant_gemm

    return quant_gemm


def no_kernels() -> str | None:
    return qg().unavailable(4, torch.float32)


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def needs_isa(isa: str):
    """``needs=`` for a claim about one instruction set: why it cannot be measured here."""
    def why() -> str | None:
        if reason := no_kernels():
            return reason
        if isa not in qg().isas():
            return f"this CPU has no {isa.upper()} (the kernels run in {', '.join(qg().isas())})"
        return None
    return why


def needs_avx512_cpu() -> str | None:
    if not {"avx512f", "avx512bw"} <= cpu_flags():
        return "this CPU has no AVX-512F/BW"
    return no_kernels()


# ------------------------------------------------------------------------------ layout

@functools.cache
def known_weight(N: int = N_SHAPE, K: int = K_SHAPE, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8)


@functools.cache
def kernel_copy() -> torch.Tensor:
    """The C++ op's int4 copy of ``known_weight()``, (N/32, K/8, 128) uint8."""
    return qg().pack(known_weight(), 4)


def bytes_per_weight(what: str) -> float:
    q = known_weight()
    if what == "int4 copy":
        t = kernel_copy()
        return t.numel() * t.element_size() / q.numel()
    if what == "int8 copy":
        t = qg().pack(q, 8)
        return t.numel() * t.element_size() / q.numel()
    scale = torch.ones(N_SHAPE, K_SHAPE // 32, dtype=torch.bfloat16)
    s, _ = qg().pack_scales(scale, None)
    t = kernel_copy()
    return (t.numel() * t.element_size() + s.numel() * s.element_size()) / q.numel()


def equal_to_snapshot() -> str:
    mine, theirs = nibbles.pack(known_weight()), kernel_copy()
    same = int((mine == theirs).sum()) if mine.shape == theirs.shape else 0
    return f"{same:,} of {theirs.numel():,}"


def where_one_weight_lives(n: int = 37, k: int = 13) -> str:
    """Pack a weight that is zero but for q[n, k] = 5 and find the one byte that is not 0."""
    q = torch.zeros(64, K_SHAPE, dtype=torch.int8)
    q[n, k] = 5
    packed = qg().pack(q, 4)
    (block, chunk, byte), = packed.nonzero().tolist()
    value = int(packed[block, chunk, byte])
    shift = 0 if value == 5 else 4 if value == 5 << 4 else -1
    return f"block {block}, byte {chunk * 128 + byte}, shift {shift}"


def kernel_nibbles(packed: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """The kernel's copy read back into (N, K) 4-bit patterns, by the snapshot's layout."""
    Nb = packed.shape[0]
    b = packed.to(torch.int64).view(Nb, K // 8, 2, 16, 4)
    lanes = (b << (8 * torch.arange(4))).sum(-1)  # (Nb, K/8, 2, 16)
    nib = torch.stack([(lanes >> (4 * p)) & 0xF for p in range(8)], -1)
    nib = nib[..., [nibbles.K_OF_P.index(i) for i in range(8)]]
    return nib.permute(0, 2, 3, 1, 4).reshape(Nb * 32, K)[:N]


def top_bit_flipped() -> str:
    """compressed-tensors stores q + 8 (offset binary); the kernel stores q's two's complement
    nibble: the same 4 bits with the top one flipped."""
    from nanoserve.quantization.packing import pack_int32

    q = known_weight()
    words = pack_int32(q, 4)  # (N, K/8) int32, as weight_packed stores them
    ct = (words.to(torch.int64)[..., None] >> (4 * torch.arange(8))) & 0xF
    ct = ct.flatten(1)  # (N, K) offset values
    ours = kernel_nibbles(kernel_copy(), *q.shape)
    return f"{int((ours == ct ^ 8).sum()):,} of {q.numel():,}"


def read_back() -> str:
    """Known integers multiplied by the identity through quant_gemm, in each ISA: the fewest
    outputs equal to the integer they should be."""
    q = known_weight(96, 64, seed=1)
    scale = torch.ones(96, 2)
    eye = torch.eye(64)
    packed = qg().pack(q, 4)
    worst = q.numel()
    for isa in qg().isas():
        got = qg().gemm(eye, packed, scale, None, 4, 32, None, 96, isa)  # (64, 96) = q.T
        worst = min(worst, int((got == q.t().float()).sum()))
    return f"{worst:,} of {q.numel():,}"


def isas_built() -> str:
    return ", ".join(qg().isas())


# ------------------------------------------------------------------------------ error

def random_case(g: torch.Generator):
    """A weight of random shape, bits, group size, zero points and scale dtype, and rows."""
    from nanoserve.quantization.weight import QuantizedWeight

    def pick(n: int) -> int:
        return int(torch.randint(0, n, (1,), generator=g))

    bits = (4, 8)[pick(2)]
    gs = (32, 64, 128, 0)[pick(4)]
    K = 8 * (1 + pick(40)) if gs == 0 else gs * (1 + pick(4))
    gs = gs or K
    N, M = 1 + pick(100), (1, 1, 2, 3, 4, 8, 9, 17)[pick(8)]
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = torch.randint(lo, hi + 1, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, K // gs, generator=g) * 0.1 + 1e-3
    zero = (torch.randint(lo, hi + 1, (N, K // gs), generator=g, dtype=torch.int8)
            if pick(2) else None)
    qw = QuantizedWeight(q, scale, zero, bits, gs).check("case")
    if pick(2):
        qw = qw.to(scale_dtype=torch.bfloat16)
    bias = torch.randn(N, generator=g) if pick(2) else None
    return qw, torch.randn(M, K, generator=g), bias, bool(pick(2))


def magnitude(x: torch.Tensor, qw, bias) -> torch.Tensor:
    """sum_k |x_k| (|q_k| + |zero|) |scale| + |bias|: the size of what the kernel adds."""
    gs = qw.group_size
    z = 0 if qw.zero is None else qw.zero.float().abs().repeat_interleave(gs, 1)
    wabs = (qw.q.float().abs() + z) * qw.scale.float().repeat_interleave(gs, 1)
    return x.abs() @ wabs.t() + (0 if bias is None else bias.abs())


@functools.cache
def kernel_error(dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """isa -> the largest |kernel - reference| over the float32-rounding bound
    2 (K + 8) 2^-24 mag (bf16 outputs: plus half a bf16 step, 2^-8 |reference|)."""
    g = torch.Generator().manual_seed(74)
    worst = dict.fromkeys(qg().isas(), 0.0)
    for _ in range(CASES):
        qw, x, bias, blocked = random_case(g)
        x = x.to(dtype)
        b = None if bias is None else bias.to(dtype)
        xf, bf = x.float(), None if b is None else b.float()
        want = F.linear(xf, qw.dequantize(torch.float32), bf)  # the reference, float32
        N, K = qw.shape
        tol = 2 * (K + 8) * EPS * magnitude(xf, qw, bf)
        if dtype == torch.bfloat16:
            tol = tol + 2.0 ** -8 * want.abs()
        packed = qg().pack(qw.q, qw.bits)
        scale, zero = qw.scale, qw.zero
        if blocked:
            scale, zero = qg().pack_scales(scale, zero)
        for isa in worst:
            got = qg().gemm(x, packed, scale, zero, qw.bits, qw.group_size, b, N, isa)
            ratio = ((got.float() - want).abs() / (tol + 1e-30)).max().item()
            worst[isa] = max(worst[isa], ratio)
    return worst


@functools.cache
def w8a8_error() -> float:
    """W8A8 against fake quantization then F.linear, every ISA: the worst over the bound."""
    from nanoserve.quantization.rtn import fake_quantize_per_token

    g = torch.Generator().manual_seed(8)
    worst = 0.0
    for _ in range(CASES // 2):
        N, K = (int(torch.randint(1, 100, (1,), generator=g)) for _ in range(2))
        M = int(torch.randint(1, 18, (1,), generator=g))
        q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        ws = torch.rand(N, generator=g) * 0.01 + 1e-4
        x = torch.randn(M, K, generator=g)
        xq = fake_quantize_per_token(x)
        w = q.float() * ws[:, None]
        want = F.linear(xq, w)
        tol = 2 * (K + 8) * EPS * (xq.abs() @ w.abs().t())
        packed = qg().pack_int8(q)
        for isa in qg().isas():
            got = qg().int8_gemm(x, packed, ws, None, N, isa)
            worst = max(worst, ((got - want).abs() / (tol + 1e-30)).max().item())
    return worst


# ------------------------------------------------------------------------------ the engine

PROMPTS = [[5, 17, 3, 99, 42], [200, 7, 7, 1, 64, 80, 31, 12, 9, 150, 4, 77], [11, 22, 33]]


@functools.cache
def quantized_checkpoint() -> Path:
    """A random Llama (transformers) through ``nanoserve quantize``: w4a16, group 32, with
    zero points, float32 scales."""
    from nanoserve.quantize.command import quantize_checkpoint

    out = Path(tempfile.mkdtemp(prefix="nanoserve-day74-")) / "w4a16-g32-asym"
    return quantize_checkpoint(hf_checkpoint("gqa"), out, "w4a16", 32, symmetric=False,
                               dtype="float32")


@functools.cache
def greedy_kernel_vs_reference() -> dict:
    from nanoserve import LLM, SamplingParams
    from nanoserve.layers.linear_methods import use_method
    from nanoserve.layers.linear_quant import QuantKernelLinear, quantized_linears

    llm = LLM(str(quantized_checkpoint()), dtype="float32", skip_tokenizer_init=True)
    model = llm.core.loaded.model
    layers = quantized_linears(model)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    def tokens() -> list[list[int]]:
        return [o.token_ids for o in llm.generate(PROMPTS, params)]

    # holding the kernel method; how many rows each takes it for (``method.rows``) is this
    # CPU's measured crossover, which a busy machine can measure as 0: not a count to state
    on_kernel = sum(isinstance(m.method, QuantKernelLinear) for m in layers)
    described = layers[0].method.describe()
    kernel = tokens()
    use_method(model, "quant_reference")
    reference = tokens()
    same = sum(a == b for ka, ra in zip(kernel, reference, strict=True)
               for a, b in zip(ka, ra, strict=True))
    return {"layers": f"{on_kernel} of {len(layers)}",
            "same": f"{same} of {sum(map(len, reference))}",
            "describe": described}


# ------------------------------------------------------------------------------ timed

@functools.cache
def one_row_times() -> dict[str, float]:
    """Seconds per call at one bf16 row on 1536 x 576, each arm cycling through ``COPIES``
    weights: the int4 g32 kernel (bf16 scales, blocked once by pack_scales), the bf16 small-M
    kernel, and dequantize_into a bf16 buffer then F.linear."""
    from nanoserve.cpu import csrc

    csrc.load()
    ops = torch.ops.nanoserve
    g = torch.Generator().manual_seed(0)
    N, K = N_SHAPE, K_SHAPE
    q = known_weight()
    scale = (torch.rand(N, K // 32, generator=g) / 64 + 1e-3).to(torch.bfloat16)
    packed, blocked = qg().pack(q, 4), qg().pack_scales(scale, None)[0]
    int4 = [(packed.clone(), blocked.clone(), scale.clone()) for _ in range(COPIES)]
    small = ops.pack_small_gemm(torch.randn(N, K, generator=g).to(torch.bfloat16))
    bf16 = [small.clone() for _ in range(COPIES)]
    x = torch.randn(1, K, generator=g).to(torch.bfloat16)
    out, buf = torch.empty(1, N, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)

    def per_call(fn, items) -> float:
        t0 = time.perf_counter()
        for item in items:
            fn(item)
        return (time.perf_counter() - t0) / len(items)

    runs = {
        "int4": lambda: per_call(
            lambda w: qg().gemm(x, w[0], w[1], None, 4, 32, None, N), int4),
        "bf16": lambda: per_call(lambda w: ops.small_gemm(out, x, w, None), bf16),
        "dequantize": lambda: per_call(lambda w: F.linear(
            x, qg().dequantize_into(buf, w[0], w[2], None, 4, 32)), int4[:COPIES // 4]),
    }
    for fn in runs.values():
        fn()  # warm up: first calls, page faults
    return best_of(15, runs, wall=lambda t: t)


def over_int4(arm: str) -> float:
    t = one_row_times()
    return t[arm] / t["int4"]


CLAIMS = [
    exact("bytes per weight of the kernel's int4 copy, 1,536 x 576",
          lambda: f"{bytes_per_weight('int4 copy'):g}", needs=no_kernels),
    exact("bytes per weight of the kernel's int8 copy, 1,536 x 576",
          lambda: f"{bytes_per_weight('int8 copy'):g}", needs=no_kernels),
    exact("bytes per weight the int4 kernel streams, group 32, bf16 scales from pack_scales",
          lambda: f"{bytes_per_weight('streamed'):g}", needs=no_kernels),
    exact("bytes of the op's int4 copy equal to the snapshot's pack, 1,536 x 576",
          equal_to_snapshot, needs=no_kernels),
    exact("where the op puts q[37, 13] of a weight with 576 inputs", where_one_weight_lives,
          needs=no_kernels),
    exact("the op's nibbles equal to compressed-tensors' with the top bit flipped, "
          "1,536 x 576", top_bit_flipped, needs=no_kernels),
    exact("a 96 x 64 weight's integers read back through quant_gemm times the identity, "
          "each instruction set", read_back, needs=no_kernels),
    exact("instruction sets the kernels run in, on a CPU with AVX-512", isas_built,
          needs=needs_avx512_cpu),
    bound("largest kernel error over the float32-rounding bound, float32 rows, 40 random "
          "weights, AVX-512", lambda: kernel_error()["avx512"], fmt="{:.4f}".format,
          needs=needs_isa("avx512")),
    bound("largest kernel error over the float32-rounding bound, float32 rows, 40 random "
          "weights, AVX2", lambda: kernel_error()["avx2"], fmt="{:.4f}".format,
          needs=needs_isa("avx2")),
    bound("largest kernel error over the float32-rounding bound, bf16 rows, 40 random "
          "weights, AVX-512", lambda: kernel_error(torch.bfloat16)["avx512"],
          fmt="{:.4f}".format, needs=needs_isa("avx512")),
    bound("largest W8A8 kernel error over the float32-rounding bound, against fake "
          "quantization then F.linear, 20 random weights, each instruction set", w8a8_error,
          fmt="{:.4f}".format, needs=no_kernels),
    exact("quantized linears on the kernel method, random Llama, w4a16 group 32 asymmetric",
          lambda: greedy_kernel_vs_reference()["layers"], needs=no_kernels),
    exact("greedy tokens with the kernels equal to the reference method's, 3 prompts x 10",
          lambda: greedy_kernel_vs_reference()["same"], needs=no_kernels),
    timed("one bf16 row, 1,536 x 576 from memory: bf16 small-M kernel time / int4 g32 "
          "kernel time", lambda: over_int4("bf16"), needs=no_kernels),
    timed("one bf16 row, 1,536 x 576 from memory: dequantize_into then F.linear time / int4 "
          "g32 kernel time", lambda: over_int4("dequantize"), needs=no_kernels),
]

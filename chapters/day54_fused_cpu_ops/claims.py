"""Day 54's numbers: the fused CPU ops against their references, the engine's tokens with them,
what a decode step dispatches before and after, what it costs, and the small-M matmul.

Op rows call ``torch.ops.nanoserve`` and the frozen references (``snapshot/reference_ops.py``)
on seeded batches at SmolLM2-135M's sizes (8 rows, hidden 576, intermediate 1536, 9 query and 3
KV heads of 64). The dataflow row runs the frozen fused forward (``snapshot/fused.py``) with the
references in place of the ops against Day 1's forward. The token row runs the package's ``LLM``
on the shipped nanoserve-tiny.

Decode rows run the package's ``LLM`` on random weights in SmolLM2-135M's shape
(``nanoserve.bench.shapes.shape_checkpoint``), 8 requests with prompts of 32 to 60 tokens, one
torch thread, in three arms: kernels off (Day 53's engine), kernels on with the same gathered
read, and kernels on with Day 55's C++ read (what ``kernels="auto"`` chooses). The weights stay
as loaded (``prepack=False``, every matmul through ``F.linear``) in both dtypes: packing and the
small-M copies depend on what a CPU has and what it measured, and the rows hold on every x86 CPU
the ops load on. Counts come from ``torch.profiler`` around the model's forward and its LM head
for one decode step; they are counts of calls, the same on every run. Timed rows are ratios of
interleaved rounds, best round of each.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from chapters.common import ROOT, SHIPPED, best_of, one_thread
from chapters.runner import bound, exact, timed

from .snapshot import reference_ops as ref
from .snapshot import small_gemm as snap_gemm
from .snapshot.fused import fused_forward

E, INTER, HQ, HKV, D, N_ROWS = 576, 1536, 9, 3, 64, 8  # SmolLM2-135M's sizes, 8 decode rows
SEEDS = range(200)


def ops_missing() -> str | None:
    """Why the C++ ops cannot run here (no compiler, NANOSERVE_NO_KERNELS), or None."""
    from nanoserve.cpu import csrc

    return csrc.load()


def nanoserve_ops():
    """``torch.ops.nanoserve``, loaded (built first if this machine never built it)."""
    why = ops_missing()
    if why:
        raise RuntimeError(why)
    return torch.ops.nanoserve


def small_gemm_missing() -> str | None:
    """Why the small-M kernel cannot run here (neither AVX512-BF16 nor AVX2 with FMA), or
    None."""
    from nanoserve.cpu.small_gemm import unavailable

    return unavailable()


def bf16_onednn_missing() -> str | None:
    """Why oneDNN's packed bf16 linear cannot be timed against the small-M kernel here (no C++
    ops, or no oneDNN bf16 kernel on this CPU), or None. The notebook's comparison only."""
    from nanoserve.cpu.onednn import unavailable

    return ops_missing() or small_gemm_missing() or unavailable(torch.device("cpu"),
                                                                torch.bfloat16)


# ---------------------------------------------------------------------------- the ops


def _batch(seed: int, dtype: torch.dtype):
    """One seeded decode-sized input for every op: x, residual, weight, gate_up, q/k/v views
    into one qkv row, the model's own cos/sin at random positions, a pool and its cells."""
    from chapters.day01_llama_forward.snapshot.config import ModelConfig
    from chapters.day01_llama_forward.snapshot.model import rope_cos_sin, rope_inv_freq

    g = torch.Generator().manual_seed(seed)
    x, res = (torch.randn(N_ROWS, E, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(E, generator=g).to(dtype)
    gu = (3 * torch.randn(N_ROWS, 2 * INTER, generator=g)).to(dtype)
    cfg = ModelConfig(vocab_size=8, hidden_size=HQ * D, intermediate_size=8,
                      num_hidden_layers=1, num_attention_heads=HQ, num_key_value_heads=HKV,
                      head_dim=D, rope_theta=100000.0)
    pos = torch.randint(0, 4096, (1, N_ROWS), generator=g)
    cos, sin = (t.reshape(N_ROWS, D) for t in rope_cos_sin(rope_inv_freq(cfg), pos, dtype))
    qkv = torch.randn(N_ROWS, (HQ + 2 * HKV) * D, generator=g).to(dtype)
    cells = torch.randperm(64, generator=g)[:N_ROWS]
    cells[0] = -1  # a padding token: rotated, never written
    return x, res, w, gu, qkv, cos, sin, cells


def _views(qkv):
    q = qkv[:, :HQ * D].view(N_ROWS, HQ, D)  # (N, Hq, D), strided like the model's
    k = qkv[:, HQ * D:(HQ + HKV) * D].view(N_ROWS, HKV, D)
    v = qkv[:, (HQ + HKV) * D:].view(N_ROWS, HKV, D)
    return q, k, v


def _run_ops(ops, batch):
    """Every op once on a copy of ``batch``; what each left behind, by name."""
    x, res, w, gu, qkv, cos, sin, cells = (t.clone() for t in batch)
    out = {}
    normed = torch.empty_like(x)
    ops.rms_norm(normed, x, w, 1e-5)
    out["rms_norm"] = normed
    ops.fused_add_rms_norm(x, res, w, 1e-5)
    out["fused_add_rms_norm"], out["residual"] = x, res
    act = gu.new_empty(N_ROWS, INTER)
    ops.silu_and_mul(act, gu)
    out["silu_and_mul"] = act
    q, k, v = _views(qkv)
    kp, vp = (q.new_zeros(64, HKV, D) for _ in range(2))
    ops.rope_and_cache(q, k, v, cos, sin, kp, vp, cells)
    out["rope q"], out["rope k"], out["k pool"], out["v pool"] = q, k, kp, vp
    return out


def _step(want: torch.Tensor) -> torch.Tensor:
    """One bf16 rounding step (8 significant bits) at each of want's magnitudes."""
    _, exp = torch.frexp(want.float().abs().clamp_min(2.0 ** -126))
    return torch.pow(2.0, (exp - 8).float())


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in bf16 rounding steps at want's magnitude."""
    return (got.float() - want.float()).abs() / _step(want)


@functools.cache
@torch.inference_mode()
def op_differences(dtype_name: str) -> dict[str, tuple[float, float, int, int]]:
    """name -> (max abs difference, max in bf16 steps, elements that differ, elements), over
    SEEDS, each op against the frozen reference."""
    dtype = getattr(torch, dtype_name)
    worst: dict[str, list] = {}
    with one_thread():
        for seed in SEEDS:
            batch = _batch(seed, dtype)
            got, want = _run_ops(nanoserve_ops(), batch), _run_ops(ref.REFERENCE_OPS, batch)
            for name in got:
                d = (got[name].float() - want[name].float()).abs()
                u = _ulps(got[name], want[name])
                w = worst.setdefault(name, [0.0, 0.0, 0, 0])
                w[0], w[1] = max(w[0], d.max().item()), max(w[1], u.max().item())
                w[2] += int((d > 0).sum())
                w[3] += d.numel()
    return {k: tuple(v) for k, v in worst.items()}


def elementwise_exact() -> str:
    d = op_differences("bfloat16")
    rope = max(d[n][0] for n in ("rope q", "rope k", "k pool", "v pool"))
    return f"{d['silu_and_mul'][0]:g} and {rope:g}"


def residual_exact() -> str:
    return " and ".join(f"{op_differences(dt)['residual'][0]:g}"
                        for dt in ("bfloat16", "float32"))


def norm_steps() -> float:
    d = op_differences("bfloat16")
    return max(d[n][1] for n in ("rms_norm", "fused_add_rms_norm"))


def norm_share() -> float:
    d = op_differences("bfloat16")
    names = ("rms_norm", "fused_add_rms_norm")
    return sum(d[n][2] for n in names) / sum(d[n][3] for n in names)


def float32_worst() -> float:
    return max(v[0] for v in op_differences("float32").values())


# ---------------------------------------------------------------------------- one norm, dispatched


class Dispatched(TorchDispatchMode):
    """Every aten op run under it, with the bytes and dtypes of the tensors it made new (an
    output that shares an input's storage, a view or a no-op cast, makes nothing new)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in _tensors(args, kwargs)}
        new = [t for t in _tensors(out) if t.untyped_storage().data_ptr() not in seen]
        self.ops.append((func.__name__.split(".")[0],
                         sum(t.numel() * t.element_size() for t in new),
                         tuple(t.dtype for t in new)))
        return out


def _tensors(*trees) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(trees) if isinstance(t, torch.Tensor)]


def plain_norm(dtype=torch.bfloat16) -> list[tuple[str, int, tuple[torch.dtype, ...]]]:
    """What Day 1's RMSNorm dispatches for 8 decode rows of 576, op by op."""
    from chapters.day01_llama_forward.snapshot.model import RMSNorm

    norm = RMSNorm(E, 1e-5).to(dtype)
    x = torch.randn(N_ROWS, 1, E, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.inference_mode(), Dispatched() as d:
        norm(x)
    return d.ops


def plain_norm_cost() -> str:
    ops = plain_norm()
    made = sum(b for _, b, _ in ops)
    fp32 = sum(b for _, b, dts in ops if torch.float32 in dts)
    result = N_ROWS * E * torch.bfloat16.itemsize
    return (f"{len(ops)} ops; {made:,} bytes, {fp32:,} of them float32, for a {result:,}-byte "
            f"result")


# ---------------------------------------------------------------------------- whole forwards


@torch.inference_mode()
def dataflow_identical() -> str:
    """The frozen fused forward over the PyTorch references against Day 1's forward: logits
    of 4 rows x 24 tokens, two checkpoints x two dtypes."""
    from chapters.day01_llama_forward.snapshot.weights import load_model
    from nanoserve.bench.shapes import shape_checkpoint

    same = total = 0
    with one_thread():
        for path in (SHIPPED, shape_checkpoint("smollm2-135m")):
            for dtype in (torch.bfloat16, torch.float32):
                model = load_model(path, dtype)
                g = torch.Generator().manual_seed(54)
                ids = torch.randint(2, model.cfg.vocab_size, (4, 24), generator=g)
                pos = torch.arange(24)[None].expand(4, 24)
                want = model.compute_logits(model(ids, pos))
                got = model.compute_logits(fused_forward(model, ids, pos, ops=ref.REFERENCE_OPS))
                same += torch.equal(got, want)
                total += 1
    return f"bit-identical, {same} of {total}"


@torch.inference_mode()
def fused_logit_error() -> float:
    """The same forward over torch.ops.nanoserve, float32: max |logit difference| to Day 1."""
    from chapters.day01_llama_forward.snapshot.weights import load_model
    from nanoserve.bench.shapes import shape_checkpoint

    worst = 0.0
    with one_thread():
        for path in (SHIPPED, shape_checkpoint("smollm2-135m")):
            model = load_model(path, torch.float32)
            g = torch.Generator().manual_seed(54)
            ids = torch.randint(2, model.cfg.vocab_size, (4, 24), generator=g)
            pos = torch.arange(24)[None].expand(4, 24)
            want = model.compute_logits(model(ids, pos))
            got = model.compute_logits(fused_forward(model, ids, pos, ops=nanoserve_ops()))
            worst = max(worst, (got - want).abs().max().item())
    return worst


def same_tokens() -> str:
    """Greedy tokens with kernels on and off, the reference read both times, float32."""
    from nanoserve import LLM, SamplingParams
    from nanoserve.bench.workload import make_workload

    wl = make_workload(16)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
              for n in wl.max_tokens]
    runs = {}
    with one_thread():
        for kernels in (False, True):
            llm = LLM(dtype="float32", kernels=kernels, attention="reference",
                      skip_tokenizer_init=True, max_num_seqs=8)
            assert llm.kernels is kernels, llm.kernels_reason
            runs[kernels] = [o.token_ids for o in llm.generate(wl.prompts, params)]
    same = sum(a == b for a, b in zip(runs[False], runs[True], strict=True))
    return f"{same} of {len(wl.prompts)} requests identical"


# ---------------------------------------------------------------------------- decode steps

ARMS = {"off": dict(kernels=False, attention="gathered"),
        "on": dict(kernels=True, attention="gathered"),
        "day55": dict(kernels=True, attention="cpu")}
LINEAR_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "nanoserve::small_gemm")


def decode_llm(dtype: str, arm: str, max_tokens: int = 256):
    """An LLM on the SmolLM2-135M shape with 8 requests admitted, prefilled and one decode step
    in: every later ``llm.core.step()`` is one decode step of 8 rows. The weights stay as
    loaded, so the matmuls are ``F.linear``'s in every arm and on every CPU (``prepack=False``
    also keeps the small-M kernel out: its copies are packed weights)."""
    from nanoserve import LLM, SamplingParams
    from nanoserve.bench.shapes import shape_checkpoint

    with one_thread():
        llm = LLM(str(shape_checkpoint("smollm2-135m")), dtype=dtype, skip_tokenizer_init=True,
                  max_num_seqs=N_ROWS, max_model_len=max_tokens + 128, prepack=False,
                  **ARMS[arm])
        g = torch.Generator().manual_seed(54)
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        for i in range(N_ROWS):
            prompt = torch.randint(2, 49000, (32 + 4 * i,), generator=g).tolist()
            llm.core.add(llm.core.make_request(f"r{i}", prompt, params))
        with torch.inference_mode():
            llm.core.step()  # the prefill of all 8
            llm.core.step()  # the first decode step
    return llm


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto announces every profiler start and stop on stderr; the table needs none of it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def profile_step(llm) -> dict:
    """One decode step under torch.profiler: the ops called inside the model's forward and its
    LM head (nested calls included), aten::copy_ among them, their self CPU time split into the
    linear layers' matmuls and everything else, and how often each op name was called."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model = llm.model
    forward, logits = model.forward, model.compute_logits

    def traced(fn, name):
        def run(*a, **k):
            with record_function(name):
                return fn(*a, **k)
        return run

    model.forward = traced(forward, "day54::forward")
    model.compute_logits = traced(logits, "day54::lm_head")
    try:
        with one_thread(), torch.inference_mode(), _quiet_stderr():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                llm.core.step()
    finally:
        del model.forward, model.compute_logits  # the class's methods again
    regions = [e for e in prof.events() if e.name.startswith("day54::")]
    ops, stack = [], [c for r in regions for c in r.cpu_children]
    while stack:
        e = stack.pop()
        ops.append(e)
        stack.extend(e.cpu_children)
    linear = sum(e.self_cpu_time_total for e in ops if e.name in LINEAR_OPS)
    total = sum(e.self_cpu_time_total for e in ops)
    return dict(ops=len(ops), copies=sum(e.name == "aten::copy_" for e in ops),
                linear_us=linear, other_us=total - linear,
                names=Counter(e.name for e in ops))


COUNT_ROUNDS = 4  # profiled steps per arm the counts are held still over (no timing in them)


@functools.cache
def profiles(dtype: str, rounds: int = 15) -> dict[str, list[dict]]:
    """``rounds`` profiled decode steps per arm, the arms interleaved."""
    llms = {arm: decode_llm(dtype, arm) for arm in ARMS}
    got: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm, llm in llms.items():
            got[arm].append(profile_step(llm))
    return got


def counts(dtype: str, key: str) -> dict[str, int]:
    """arm -> the profiled steps' ``key`` count (``"ops"`` or ``"copies"``); refuses to state
    a count that changed from one step to the next. Only the count being stated is held still:
    on some CPUs a bf16 step that opens a new KV block dispatches a few hundred more views and
    selects than the step before, while its copies stay put."""
    out = {}
    for arm, runs in profiles(dtype, COUNT_ROUNDS).items():
        seen = {r[key] for r in runs}
        if len(seen) != 1:
            raise RuntimeError(f"{arm}: the {key} counts changed between steps: {sorted(seen)}")
        out[arm] = seen.pop()
    return out


def op_counts(dtype: str) -> str:
    return "; ".join(f"{n:,}" for n in counts(dtype, "ops").values())


def copy_counts(dtype: str) -> str:
    return "; ".join(f"{c:,}" for c in counts(dtype, "copies").values())


def other_time_ratio(dtype: str, arm: str) -> float:
    """Non-matmul self CPU time per step, kernels off / ``arm``: the least of each arm's profiled
    steps, which were interleaved (a busy neighbour only ever adds time)."""
    p = profiles(dtype)
    return min(r["other_us"] for r in p["off"]) / min(r["other_us"] for r in p[arm])


@functools.cache
@torch.inference_mode()
def decode_seconds(dtype: str, arms: tuple[str, ...], rounds: int = 5, steps: int = 8) -> dict:
    """arm -> the best of ``rounds`` interleaved rounds of ``steps`` decode steps of 8 rows
    (chapters.common.best_of), every arm in one run."""
    llms = {name: decode_llm(dtype, name, max_tokens=rounds * steps + 16) for name in arms}

    def run(llm):
        def go() -> float:
            t0 = time.perf_counter()
            for _ in range(steps):
                llm.core.step()
            return time.perf_counter() - t0
        return go

    return best_of(rounds, {name: run(llm) for name, llm in llms.items()}, lambda s: s)


def throughput_ratio(dtype: str, arm: str) -> float:
    """Decode tokens/s, ``arm`` / kernels off: the time ratio, as both make 8 tokens a step."""
    best = decode_seconds(dtype, tuple(ARMS))
    return best["off"] / best[arm]


# ---------------------------------------------------------------------------- small-M matmul

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "lm head": (49152, 576)}  # (N, K), as nn.Linear holds them


def _weight(n: int, k: int) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)).bfloat16()


def packing_identical() -> str:
    same = sum(torch.equal(nanoserve_ops().pack_small_gemm(_weight(n, k)),
                           snap_gemm.pack(_weight(n, k)))
               for n, k in SHAPES.values())
    return f"{same} of {len(SHAPES)} identical"


@torch.inference_mode()
def small_gemm_steps() -> float:
    """small_gemm against float32 sums rounded once, 1 to 8 rows, every shape: the largest
    difference, in bf16 rounding steps of the call's largest output. (A sum that cancels to
    near zero is many of its own steps away from any other order's, oneDNN's included; measured
    against the outputs' scale, a sum-order difference stays under one step.)"""
    worst = 0.0
    with one_thread():
        for n, k in SHAPES.values():
            w = _weight(n, k)
            packed = nanoserve_ops().pack_small_gemm(w)
            for m in range(1, 9):
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
                out = torch.empty(m, n, dtype=torch.bfloat16)
                torch.ops.nanoserve.small_gemm(out, x, packed, None)
                want = snap_gemm.small_gemm_reference(x, w)
                diff = (out.float() - want.float()).abs().max()
                worst = max(worst, (diff / _step(want.float().abs().max())).item())
    return worst


@torch.inference_mode()
def onednn_over_small(name: str, rows: int, rounds: int = 5) -> float:
    """oneDNN's packed linear time / the small-M kernel's, one weight shape, ``rows`` rows,
    interleaved rounds of repeated calls, best round of each."""
    n, k = SHAPES[name]
    w = _weight(n, k)
    dnn = torch.ops.mkldnn._reorder_linear_weight(w, N_ROWS)
    small = nanoserve_ops().pack_small_gemm(w)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).bfloat16()
    out = torch.empty(rows, n, dtype=torch.bfloat16)
    calls = 20 if n > 10_000 else 200

    def arm(fn):
        def go() -> float:
            fn()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            return time.perf_counter() - t0
        return go

    best = best_of(rounds, {
        "onednn": arm(lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, None, "none", [], "")),
        "small": arm(lambda: torch.ops.nanoserve.small_gemm(out, x, small, None))},
        lambda s: s)
    return best["onednn"] / best["small"]


# ---------------------------------------------------------------------------- the build


def cached_load_s() -> float:
    """``python -m nanoserve.cpu.csrc`` in a fresh process, once the library is built: the time its
    ``load()`` took, read from its own report. Refuses a run that built instead of loading."""
    reason = ops_missing()  # builds it here first if it had never been built
    if reason:
        raise RuntimeError(reason)
    out = subprocess.run([sys.executable, "-m", "nanoserve.cpu.csrc"], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    m = re.search(r"C\+\+ ops: cached .*; load ([\d.]+) s", out)
    if not m:
        raise RuntimeError(f"not a cached load: {out.strip()}")
    return float(m[1])


# ---------------------------------------------------------------------------- the table

OPS_AT = "200 seeded batches at SmolLM2-135M's sizes, 8 rows"
DECODE = "SmolLM2-135M shape, one decode step of 8 rows"
ARMS_TEXT = "kernels off; on; on with Day 55's read"
RATIO = "{:.2f}x".format
NEED = ops_missing

CLAIMS = [
    exact(f"max abs difference from the PyTorch reference, bf16, {OPS_AT}: silu_and_mul; "
          "rope_and_cache (q, k and the pool cells)", elementwise_exact, needs=NEED),
    exact("the residual stream `fused_add_rms_norm` leaves, against the reference add: max abs "
          "difference, bf16 and float32", residual_exact, needs=NEED),
    bound(f"rms_norm and fused_add_rms_norm, bf16, {OPS_AT}: largest difference from the "
          "reference, in bf16 rounding steps", norm_steps, fmt="{:g}".format, needs=NEED),
    bound("share of their bf16 outputs that differ from the reference at all", norm_share,
          fmt="{:.4%}".format, needs=NEED),
    bound(f"the four ops against their references, float32, {OPS_AT}: max abs difference",
          float32_worst, fmt="{:.1e}".format, needs=NEED),
    exact("one bf16 RMSNorm of 8 rows x 576 (Day 1's module): aten ops dispatched; bytes of "
          "the tensors they make", plain_norm_cost),
    exact("the fused forward's dataflow with the PyTorch references for the ops (snapshot) "
          "against Day 1's forward: logits, nanoserve-tiny and the SmolLM2-135M shape, bf16 and "
          "float32", dataflow_identical),
    bound("the same forward through `torch.ops.nanoserve`, float32: max abs logit difference",
          fused_logit_error, fmt="{:.1e}".format, needs=NEED),
    exact("greedy tokens, `kernels=True` against `kernels=False`, `attention=\"reference\"`, "
          "float32, nanoserve-tiny, 16 requests (prompts of 16-192 tokens, 16-128 new), 8 rows",
          same_tokens, needs=NEED),
    exact(f"ops the profiler records in the forward and LM head, float32, {DECODE}: {ARMS_TEXT}",
          lambda: op_counts("float32"), needs=NEED),
    exact("aten::copy_ calls among them, float32", lambda: copy_counts("float32"), needs=NEED),
    exact("aten::copy_ calls in the same step in bf16", lambda: copy_counts("bfloat16"),
          needs=NEED),
    timed("non-matmul self CPU time per decode step, float32, kernels off / on",
          lambda: other_time_ratio("float32", "on"), fmt=RATIO, needs=NEED),
    timed("the same, kernels off / on with Day 55's read",
          lambda: other_time_ratio("float32", "day55"), fmt=RATIO, needs=NEED),
    timed("decode tokens/s, kernels on / off (gathered read both), float32, SmolLM2-135M shape, "
          "8 rows, one thread, any x86 CPU the ops load on",
          lambda: throughput_ratio("float32", "on"), fmt=RATIO, needs=NEED),
    timed("the same with Day 55's read as well (what `kernels=\"auto\"` picks) / off, float32",
          lambda: throughput_ratio("float32", "day55"), fmt=RATIO, needs=NEED),
    exact("`pack_small_gemm` against the snapshot's PyTorch repacking, SmolLM2-135M's five "
          "weight shapes", packing_identical, needs=NEED),
    bound("small_gemm against float32 sums rounded once, 1-8 rows, the five shapes: largest "
          "difference, in bf16 rounding steps of the call's largest output", small_gemm_steps,
          fmt="{:g}".format, needs=small_gemm_missing),
    timed("`python -m nanoserve.cpu.csrc` with the library built: load time", cached_load_s,
          needs=NEED),
]

"""Day 55's numbers: the C++ CPU decode-attention kernel against its reference, the engine's
greedy tokens with it, what it materialises, and what it costs in time on this CPU.

Error rows call ``torch.ops.nanoserve.paged_decode_attention`` and the package's
``decode_attention_reference`` (``nanoserve.cpu.csrc.reference``) on seeded ragged batches over
scrambled pools; the frozen plain-torch model (``snapshot/paged_decode.py``) is held against the
compiled op. Token rows run the package's ``LLM`` on nanoserve-tiny. Bytes come from the
package's ``workspace_bytes`` for the other reads and from the snapshot's mirror of the kernel's
allocations for this one (computed, not measured). Timed rows are ratios of interleaved rounds.

The two-thread row needs a second core that nothing else is using, which a shared machine does
not promise, so it is recorded: ``results/two-threads.json`` is written by::

    .venv/bin/python -m chapters.day55_cpu_paged_attention.claims --record-two-threads

which waits (ten minutes, or ``--wait SECONDS``) until other processes hold at most half a core,
then times, and refuses to write if they took the core back meanwhile.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from chapters.common import SHIPPED, best_of
from chapters.runner import bound, exact, recorded, timed

from .snapshot import paged_decode as snap

# (GQA group, head_dim, block_size): every group, head size and block size of the brief once;
# 72 leaves a scalar tail past AVX-512's 16 lanes, 80 does not.
CONFIGS = ((1, 72, 1), (3, 80, 16), (8, 72, 32))
LENS = (1, 37, 600, 2000)  # one token; under a tile; two splits; four splits
KV_HEADS = 2
SMOL = (9, 3, 64)  # SmolLM2-135M's attention: query heads, KV heads, head_dim
RAGGED = [2000, 1500, 900, 600, 300, 128, 50, 10]


def kernel_missing() -> str | None:
    """Why the C++ ops cannot run here (no compiler, NANOSERVE_NO_KERNELS), or None."""
    from nanoserve.cpu import csrc

    return csrc.load()


def case(lens, block_size: int, hkv: int, group: int, head_dim: int, dtype=torch.float32,
         seed: int = 0, poison: bool = False):
    """q (B, Hq, D); pools (cells, Hkv, D) whose blocks are handed out scrambled; the (B, W)
    int64 block table with -1 past each row's end, as the CPU backend plans a decode step;
    context lengths. ``poison``: every pool cell no row owns holds NaN."""
    g = torch.Generator().manual_seed(seed)
    B, W = len(lens), -(-max(lens) // block_size)
    num_blocks = B * W + 3
    table = torch.randperm(num_blocks, generator=g)[:B * W].view(B, W).clone()
    for b, n in enumerate(lens):
        table[b, -(-n // block_size):] = -1
    shape = (num_blocks * block_size, hkv, head_dim)
    kp, vp = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    if poison:
        owned = torch.zeros(shape[0], dtype=torch.bool)
        for b, n in enumerate(lens):
            owned[snap.cells_of(table[b].tolist(), n, block_size)] = True
        kp[~owned] = vp[~owned] = math.nan
    q = torch.randn(B, hkv * group, head_dim, generator=g)
    return q.to(dtype), kp.to(dtype), vp.to(dtype), table.contiguous(), torch.tensor(lens)


def kernel(q, kp, vp, table, ctx, block_size):
    """The op as the engine calls it (``CPUBackend._kernel``)."""
    why = kernel_missing()  # loads the library on first use
    if why:
        raise RuntimeError(why)
    out = torch.empty_like(q)
    torch.ops.nanoserve.paged_decode_attention(out, q, kp, vp, table, ctx, block_size,
                                               q.shape[-1] ** -0.5)
    return out


def reference(q, kp, vp, table, ctx, block_size):
    from nanoserve.cpu.csrc.reference import decode_attention_reference

    return decode_attention_reference(q, kp, vp, table, ctx, block_size)


def model(q, kp, vp, table, ctx, block_size, counts=None):
    return snap.paged_decode_attention(q, kp, vp, table, ctx, block_size,
                                       q.shape[-1] ** -0.5, counts)


def abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# ---------------------------------------------------------------------------- correctness


@functools.cache
@torch.inference_mode()
def errors(dtype_name: str) -> tuple[float, ...]:
    """Max |kernel - reference| per configuration, contexts LENS, scrambled blocks."""
    dtype = getattr(torch, dtype_name)
    worst = []
    for seed, (group, head_dim, bs) in enumerate(CONFIGS):
        args = case(LENS, bs, KV_HEADS, group, head_dim, dtype, seed)
        worst.append(abs_err(kernel(*args, bs), reference(*args, bs)))
    return tuple(worst)


@functools.cache
@torch.inference_mode()
def model_errors() -> tuple[float, ...]:
    """Max |frozen model - kernel| per configuration, float32."""
    worst = []
    for seed, (group, head_dim, bs) in enumerate(CONFIGS):
        args = case(LENS, bs, KV_HEADS, group, head_dim, torch.float32, seed)
        worst.append(abs_err(model(*args, bs), kernel(*args, bs)))
    return tuple(worst)


@torch.inference_mode()
def poisoned() -> str:
    """NaN in every cell no row owns: a read that touched one would spoil its row."""
    group, head_dim, bs = CONFIGS[1]
    args = case(LENS, bs, KV_HEADS, group, head_dim, poison=True)
    out = kernel(*args, bs)
    bad = int((~torch.isfinite(out).flatten(1).all(1)).sum())
    return f"{bad} of {len(LENS)}"


# ---------------------------------------------------------------------------- structure


def tasks_one_long_row() -> str:
    """The parallel loop for one 2,000-token row at SmolLM2-135M's 3 KV heads, with splits and
    without: and what 2 cores could give for the unsplit loop (the busier core does
    ceil(tasks / 2))."""
    rows, hkv, splits = snap.task_grid(1, SMOL[1], [2000])
    unsplit = rows * hkv
    ceiling = unsplit / -(-unsplit // 2)
    return (f"{rows} × {hkv} × {splits} = {rows * hkv * splits} "
            f"({unsplit} without splits: at most {ceiling:.1f}x on 2 cores)")


@functools.cache
@torch.inference_mode()
def ragged_counts() -> snap.Counts:
    counts = snap.Counts()
    hq, hkv, d = SMOL
    args = case(RAGGED, 16, hkv, hq // hkv, d)
    model(*args, 16, counts)
    return counts


def k_vectors() -> str:
    c = ragged_counts()
    return f"{c.k_rows:,} / {c.k_rows * SMOL[0] // SMOL[1]:,}"


def tiles_and_tasks() -> str:
    c = ragged_counts()
    return f"{c.tasks} tasks, {c.tiles:,} tiles"


# ---------------------------------------------------------------------------- tokens


@functools.cache
def engine_runs() -> dict:
    """Greedy tokens from LLM with each read: 8 prompts of 5 to 700 tokens over 4 slots, a
    256-token step budget (chunked prefill beside decodes), a pool of 80 16-token blocks that
    forces preemption. Kernel calls are counted on the cache, per kind of step, and in the
    decode steps that ``decode_layers`` runs (Day 54's later loop in C++: one call a layer)."""
    from nanoserve import LLM, SamplingParams
    from nanoserve.attention.backends.cpu import CPUBackend
    from nanoserve.cpu import fused

    g = torch.Generator().manual_seed(55)
    lens = (700, 20, 550, 90, 5, 300, 610, 40)
    prompts = [torch.randint(2, 2000, (n,), generator=g).tolist() for n in lens]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
              for m in (24, 40, 16, 32, 48, 8, 20, 36)]
    calls = {"decode": 0, "mixed": 0, "longest": 0}
    plain = CPUBackend._kernel

    def counted(self, q, kp, vp, blocks, context_lens):
        calls["mixed" if self.cache._step.packed_lens is not None else "decode"] += 1
        calls["longest"] = max(calls["longest"], int(context_lens.max()))
        return plain(self, q, kp, vp, blocks, context_lens)

    loop = fused._decode_layers

    def counted_loop(model, residual, cos, sin, backend, cells):
        h = loop(model, residual, cos, sin, backend, cells)
        if h is not None:  # the step's reads ran inside the C++ loop
            calls["decode"] += len(model.layers)
            calls["longest"] = max(calls["longest"], int(backend.kernel_decode()[1].max()))
        return h

    arms = {"reference": dict(kernels=False, attention="reference"),
            "cpu, fused ops off": dict(kernels=False, attention="cpu"),
            "cpu": dict(kernels="auto", attention="cpu")}
    runs = {}
    CPUBackend._kernel, fused._decode_layers = counted, counted_loop
    try:
        for name, kw in arms.items():
            for k in calls:
                calls[k] = 0
            llm = LLM(SHIPPED, dtype="float32", max_num_seqs=4, block_size=16,
                      num_kv_blocks=80, max_model_len=1024, max_num_batched_tokens=256,
                      skip_tokenizer_init=True, **kw)
            out = [o.token_ids for o in llm.generate(prompts, params)]
            runs[name] = dict(tokens=out, preemptions=llm.stats.preemptions,
                              layers=llm.model.cfg.num_hidden_layers, **calls)
    finally:
        CPUBackend._kernel, fused._decode_layers = plain, loop
    return runs


def tokens() -> str:
    runs = engine_runs()
    ref = runs["reference"]["tokens"]
    bad = {name: sum(a != b for a, b in zip(ref, r["tokens"], strict=True))
           for name, r in runs.items() if name != "reference"}
    pre = min(r["preemptions"] for r in runs.values())
    worst = max(bad.values())
    return (f"{worst} of {len(ref)} requests differ, fused ops on and off, "
            f"through {pre} preemptions")


def kernel_calls() -> str:
    r = engine_runs()["cpu"]
    per = r["layers"]
    return (f"{r['decode'] // per} decode steps, {r['mixed'] // per} runs of decode rows in "
            f"mixed steps; longest context {r['longest']} tokens "
            f"({-(-r['longest'] // snap.K_SPLIT)} splits)")


def auto_choice() -> str:
    from nanoserve import LLM

    llm = LLM(SHIPPED, dtype="float32", skip_tokenizer_init=True, max_model_len=64)
    return f"attention={llm.attention}, kernels={llm.kernels}"


# ---------------------------------------------------------------------------- workspace


def workspace(lens: list[int]) -> str:
    """One layer's read, bf16 pools, 16-token blocks: the package's figures for the other
    reads, the snapshot's mirror of the kernel's allocations for this one."""
    from nanoserve.attention.selector import workspace_bytes

    others = [workspace_bytes(p, lens, *SMOL, 2, block_size=16)
              for p in ("reference", "gathered", "triton")]
    mine = snap.workspace_bytes(lens, *SMOL, 16)
    return " / ".join(f"{b:,}" for b in [*others, mine])


def kernel_bytes_parts(lens: list[int]) -> str:
    hq, hkv, d = SMOL
    B, W, S = len(lens), -(-max(lens) // 16), snap.num_splits(lens)
    table = B * W * 8
    partials = snap.workspace_bytes(lens, *SMOL, 16) - table
    return (f"{table:,} ({B} × {W} int64 block ids) + {partials:,} "
            f"({B} × {hkv} × {S} tasks × {hq // hkv} × {d + 2} float32 partials)")


# ---------------------------------------------------------------------------- timed


def layouts(table: torch.Tensor, ctx: torch.Tensor, block_size: int, chunk: int = 32):
    """The same rows as the other reads want them: the reference's (B, S) cell rectangle, and
    Day 50's (n, C) chunk cells with each chunk's row."""
    lens = ctx.tolist()
    rect = torch.full((len(lens), max(lens)), -1)
    chunks, owner = [], []
    for b, n in enumerate(lens):
        cells = torch.tensor(snap.cells_of(table[b].tolist(), n, block_size))
        rect[b, :n] = cells
        for s in range(0, n, chunk):
            c = torch.full((chunk,), -1)
            piece = cells[s:s + chunk]
            c[:len(piece)] = piece
            chunks.append(c)
            owner.append(b)
    return rect, torch.stack(chunks), torch.tensor(owner)


@functools.cache
@torch.inference_mode()
def read_times(dtype_name: str, context: int, rounds: int = 15) -> dict[str, float]:
    """Seconds per call of one layer's decode read, 8 rows of ``context`` tokens at SmolLM2's
    heads, 16-token blocks: the three reads interleaved round by round on one thread."""
    hq, hkv, d = SMOL
    q, kp, vp, table, ctx = case([context] * 8, 16, hkv, hq // hkv, d,
                                 getattr(torch, dtype_name))
    rect, cells, owner = layouts(table, ctx, 16)
    calls = max(3, 6000 // context)
    from nanoserve.attention.backends.gathered import paged_attention_gathered
    from nanoserve.attention.reference import paged_attention_batched_reference

    def timer(fn):
        def run():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - t0) / calls
        return run

    runs = {"kernel": timer(lambda: kernel(q, kp, vp, table, ctx, 16)),
            "gathered": timer(lambda: paged_attention_gathered(q, kp, vp, cells, owner)),
            "reference": timer(lambda: paged_attention_batched_reference(
                q[:, :, None], kp, vp, rect, (ctx - 1)[:, None], ctx))}
    return best_of(rounds, runs, lambda s: s)


def speedup(other: str, dtype_name: str, context: int) -> float:
    t = read_times(dtype_name, context)
    return t[other] / t["kernel"]


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies over all cores, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)  # idle + iowait


def two_cores_missing(look: float = 0.5) -> str | None:
    """Why a two-thread ratio cannot be measured now: no kernel, fewer than 2 cores, or other
    processes holding more than half a core (looked at for ``look`` seconds while this one
    sleeps). A busy neighbour makes the second thread wait, and the ratio says nothing about
    the kernel then."""
    why = kernel_missing()
    if why:
        return why
    cores = os.cpu_count() or 1
    if cores < 2:
        return f"one core here ({cores})"
    try:
        idle0, total0 = _cpu_times()
        time.sleep(look)
        idle1, total1 = _cpu_times()
    except OSError:
        return None  # no /proc/stat: measure and let the verdict speak
    busy = cores * (1 - (idle1 - idle0) / max(1, total1 - total0))
    if busy > 0.5:
        return f"other processes hold {busy:.1f} of the {cores} cores"
    return None


@torch.inference_mode()
def two_cores(rounds: int = 15, calls: int = 100) -> float:
    """One row of 2,000 tokens, bf16: the kernel's time on one thread over its time on two,
    the two settings interleaved round by round, best of each."""
    hq, hkv, d = SMOL
    args = case([2000], 16, hkv, hq // hkv, d, torch.bfloat16)
    best = {1: math.inf, 2: math.inf}
    for _ in range(rounds):
        for n in best:
            with threads(n):
                t0 = time.perf_counter()
                for _ in range(calls):
                    kernel(*args, 16)
                best[n] = min(best[n], time.perf_counter() - t0)
    return best[1] / best[2]


TWO_THREADS = "two-threads.json"


def record_two_threads(wait_s: float = 600.0, command: str = "") -> Path:
    """Time ``two_cores`` once the second core is free, and write ``results/TWO_THREADS`` with
    the machine, the date and this command. Refuses to write if the machine never quietens."""
    from nanoserve.cpu import csrc

    deadline = time.monotonic() + wait_s
    while (why := two_cores_missing()) is not None:
        if time.monotonic() > deadline:
            raise SystemExit(f"not recorded: {why}")
        time.sleep(2.0)
    ratio = two_cores()
    after = two_cores_missing()  # the neighbours again, so a run they disturbed is refused
    if after is not None:
        raise SystemExit(f"not recorded: {after} (right after timing)")
    from nanoserve.model.weights import cpu_flags

    flags = cpu_flags()
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    data = {"machine": f"x86_64 {csrc.cpu_signature()}, {os.cpu_count()} cores, "
                       f"{' '.join(isa)}, no GPU",
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": command or "python -m chapters.day55_cpu_paged_attention.claims "
                                  "--record-two-threads",
            "what": "one row of 2,000 tokens, bf16, SmolLM2-135M heads, 16-token blocks: best "
                    "of 15 interleaved rounds of 100 calls on 1 thread and on 2",
            "values": {"one_over_two": round(ratio, 3)}}
    path = Path(__file__).resolve().parent / "results" / TWO_THREADS
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


# ---------------------------------------------------------------------------- the table

HW = "2-core x86 CPU"
ERR = "max abs error vs `decode_attention_reference`, 3 configurations × contexts 1, 37, 600, 2,000"
NEED = kernel_missing


def err_fmt(v: float) -> str:
    return f"{v:.1e}"


def _timed_rows():
    rows = []
    for other in ("gathered", "reference"):
        for dtype_name in ("float32", "bfloat16"):
            for context in (128, 2000):
                short = "bf16" if dtype_name == "bfloat16" else dtype_name
                label = (f"decode read time, {other} / kernel, 8 rows × {context:,} tokens, "
                         f"{short} ({HW}, one thread)")
                rows.append(timed(label, functools.partial(speedup, other, dtype_name, context),
                                  fmt="{:.2f}x".format, needs=NEED))
    return rows


CLAIMS = [
    bound(f"kernel {ERR}, float32", lambda: max(errors("float32")), fmt=err_fmt, needs=NEED),
    bound(f"kernel {ERR}, bf16", lambda: max(errors("bfloat16")), fmt=err_fmt, needs=NEED),
    bound("frozen plain-torch model vs the compiled kernel, float32, worst of the three",
          lambda: max(model_errors()), fmt=err_fmt, needs=NEED),
    exact("NaN in every pool cell no row owns: rows with a non-finite output", poisoned,
          needs=NEED),
    exact("tasks for one row × 2,000 tokens, 3 KV heads: rows × KV heads × splits",
          tasks_one_long_row),
    exact("the ragged batch (SmolLM2-135M heads 9/3, D=64): K vectors fetched, GQA group "
          "together / one query head at a time", k_vectors),
    exact("the same batch: tasks run, 16-token tiles scored", tiles_and_tasks),
    exact("`LLM()` on nanoserve-tiny, float32, this machine: what `auto` resolves to",
          auto_choice, needs=NEED),
    exact("greedy tokens, `attention=\"cpu\"` against `attention=\"reference\", kernels=False` "
          "(nanoserve-tiny, float32, 8 requests of 5 to 700 prompt tokens, 4 slots, "
          "80 blocks of 16)", tokens, needs=NEED),
    exact("kernel calls in that run, per layer; the longest context it read", kernel_calls,
          needs=NEED),
    exact("one layer's decode read workspace, bytes, the ragged batch (bf16, 16-token blocks): "
          "reference / gathered / Triton (Day 61) / this kernel", lambda: workspace(RAGGED)),
    exact("this kernel's bytes for the ragged batch, from its allocations",
          lambda: kernel_bytes_parts(RAGGED)),
    exact("the same four reads, 8 rows × 2,000 tokens", lambda: workspace([2000] * 8)),
    *_timed_rows(),
    recorded(f"one row × 2,000 tokens, bf16: kernel time on 1 thread / on 2 ({HW}, the second "
             "core idle; recorded)", TWO_THREADS, "one_over_two", fmt="{:.2f}x".format),
]


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] != ["--record-two-threads"] or len(args) not in (1, 3) or \
            (len(args) == 3 and args[1] != "--wait"):
        raise SystemExit("usage: python -m chapters.day55_cpu_paged_attention.claims "
                         "--record-two-threads [--wait SECONDS]")
    wait = float(args[2]) if len(args) == 3 else 600.0
    cmd = " ".join(["python -m chapters.day55_cpu_paged_attention.claims", *args])
    print(f"wrote {record_two_threads(wait, cmd)}")

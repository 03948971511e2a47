"""Day 62's numbers: ``attention="triton"`` in the engine, greedy tokens against the reference
path under preemption, where each step's attention went, the H200 compile of every kernel
configuration on this CPU, and the card's numbers (read from results/kernel.json when a card
has written it; skipped without one).

The engine runs a small random transformers-written checkpoint in float32; the kernel runs under
Triton's interpreter, which costs milliseconds per program, so the run is kept tiny.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys

import torch

from chapters.common import ROOT, hf_checkpoint
from chapters.runner import exact, gpu

from .snapshot import configs as snap_configs
from .snapshot import engine_read as snap

PROMPTS = [[0, *range(3 + i, 9 + 3 * i)] for i in range(5)]
MAX_TOKENS = [5 + i for i in range(5)]
# A cramped pool: 36 cells for 5 requests, so rows are preempted; whole-prompt steps, as Day 62
# counted its kernel calls before the token budget.
ENGINE = dict(dtype="float32", skip_tokenizer_init=True, block_size=4, max_num_seqs=3,
              num_kv_blocks=9, enable_chunked_prefill=False)


@functools.cache
def engine_runs() -> dict:
    """The same requests through attention="reference" and attention="triton". In the triton
    run every call of the kernel and of packed prefill is counted, and each kernel call's block
    ids are held against the frozen snapshot's, read from the slot table at that moment."""
    import nanoserve.attention.backends.base
    import nanoserve.cuda.kernels
    from nanoserve import LLM, SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
    runs, seen = {}, {"kernel": [], "packed": 0, "reference": 0}
    kernel = nanoserve.cuda.kernels.paged_attention
    packed = nanoserve.attention.backends.base.packed_prefill_attention
    ref = nanoserve.attention.backends.base.paged_attention_batched_reference
    for attention in ("reference", "triton"):
        llm = LLM(hf_checkpoint("gqa"), attention=attention, **ENGINE)
        cache = llm.engine.cache
        if attention == "triton":
            def spy_kernel(q, k, v, blocks, ctx, bs, *a, cache=cache, **kw):
                step = cache._step
                mine = snap.block_ids(cache.slots.cells, step.rows, step.ctx, bs)
                seen["kernel"].append((q.shape[2], torch.equal(mine, blocks)))
                return kernel(q, k, v, blocks, ctx, bs, *a, **kw)

            def spy_packed(*a, **kw):
                seen["packed"] += 1
                return packed(*a, **kw)

            def spy_ref(*a, **kw):
                seen["reference"] += 1
                return ref(*a, **kw)

            nanoserve.cuda.kernels.paged_attention = spy_kernel
            nanoserve.attention.backends.base.packed_prefill_attention = spy_packed
            nanoserve.attention.backends.base.paged_attention_batched_reference = spy_ref
        try:
            outs = llm.generate(PROMPTS, params)
        finally:
            nanoserve.cuda.kernels.paged_attention = kernel
            nanoserve.attention.backends.base.packed_prefill_attention = packed
            nanoserve.attention.backends.base.paged_attention_batched_reference = ref
        runs[attention] = ([o.token_ids for o in outs], llm.stats.preemptions,
                           llm.stats.decode_steps)
    runs["seen"] = seen
    return runs


def tokens() -> str:
    r = engine_runs()
    (ref, pre_ref, _), (tri, pre_tri, _) = r["reference"], r["triton"]
    differ = sum(a != b for a, b in zip(ref, tri, strict=True))
    pre = f"{pre_tri} preemptions each" if pre_ref == pre_tri else f"{pre_ref} vs {pre_tri}"
    return f"{differ} of {len(tri)} differ; {pre}"


def kernel_calls() -> str:
    r = engine_runs()
    calls = r["seen"]["kernel"]
    layers = 2  # the gqa checkpoint's num_hidden_layers
    many = sum(t > 1 for t, _ in calls)
    return (f"{len(calls)} calls = {r['triton'][2]} decode steps × {layers} layers; "
            f"{many} with more than one query token")


def prefill_calls() -> str:
    seen = engine_runs()["seen"]
    return f"{seen['packed']} / {seen['reference']}"


def block_ids_agree() -> str:
    calls = engine_runs()["seen"]["kernel"]
    return f"{sum(ok for _, ok in calls)} of {len(calls)}"


@torch.inference_mode()
def kernel_prefill_reads(n: int = 512, block_size: int = 16) -> list[int]:
    """Positions each of a prompt's ``n`` query tokens reads through the kernel, one KV head and
    one layer, counted from the kernel's own output. Every key is zero, so each position the
    kernel loads for a query gets the same softmax weight; only the first position's value is
    non-zero (1 in lane 0), so query i's output there is one over the number of positions it
    read. Blocks are handed out in reverse, so the reads go through the table, not in order.
    One tile covers the whole prompt, so the interpreter runs each query's program in one pass
    (the count does not depend on the tile: a tile masks the loads past a query's horizon)."""
    from nanoserve.cuda.kernels import paged_attention

    D = 16
    blocks = -(-n // block_size)
    table = torch.arange(blocks - 1, -1, -1)[None]  # (1, W) block ids, scrambled
    k = torch.zeros(blocks * block_size, 1, D)  # (cells, Hkv=1, D)
    v = torch.zeros_like(k)
    v[int(table[0, 0]) * block_size, 0, 0] = 1.0  # the cell of position 0
    q = torch.zeros(1, 1, n, D)  # (B, Hq, T, D): the whole prompt as queries
    out = paged_attention(q, k, v, table, torch.tensor([n]), block_size,
                          q_positions=torch.arange(n)[None], splits=1, tile=512)
    return [round(1 / x) for x in out[0, 0, :, 0].tolist()]


@functools.cache
def prefill_reads() -> str:
    reads = kernel_prefill_reads()
    return f"{sum(reads):,}"


def prefill_reads_formula() -> str:
    """The frozen snapshot's closed form, n(n + 1) / 2, against the count above."""
    return ("agrees" if snap.prefix_cells_read(512) == int(prefill_reads().replace(",", ""))
            else "differs")


def _windowless(job) -> bool:
    """One of Day 62's configurations: Day 70 added windowed variants (``has_window``) to the
    package's list, which this chapter's rows leave out."""
    kind, args = job
    return not any(getattr(a, "has_window", False) for a in args)


@functools.cache
def compile_all() -> tuple[int, int, bool]:
    """``python -m tools.kernel_aot`` in a subprocess without the interpreter, as the tests
    run it: (compiled, jobs, every compiled job reached a cubin), over Day 62's windowless
    configurations. Once per process; Triton's cache (~/.triton/cache) makes a rerun of
    unchanged kernels quick."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run([sys.executable, "-m", "tools.kernel_aot", "--no-window"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = run.stdout.strip().splitlines()
    m = re.match(r"(\d+)/(\d+) compiled for GPUTarget\(backend='cuda', arch=90", lines[-1])
    if run.returncode or not m:
        raise RuntimeError(f"aot failed: {run.stdout[-2000:]}{run.stderr[-2000:]}")
    cubins = all("cubin" in ln for ln in lines if ln.startswith("ok"))
    return int(m[1]), int(m[2]), cubins


def compiled() -> str:
    done, total, cubins = compile_all()
    return f"{done} of {total}" + ("" if cubins else " (some without a cubin)")


def configs_agree() -> str:
    from tools.kernel_aot import jobs

    def plain(job):  # a configuration's fields, less the window Day 70 added
        kind, args = job
        return kind, tuple(tuple(v for k, v in dataclasses.asdict(a).items()
                                 if k != "has_window") if dataclasses.is_dataclass(a) else a
                           for a in args)

    live = [plain(j) for j in jobs() if _windowless(j)]
    frozen = [plain(j) for j in snap_configs.jobs()]
    same = (sum(a == b for a, b in zip(live, frozen, strict=True))
            if len(live) == len(frozen) else 0)
    attention = sum(k == "attention" for k, _ in frozen)
    return f"{same} of {len(frozen)} identical ({attention} attention, " \
           f"{len(frozen) - attention} merge)"


def _card(key: str):
    from .bench import measure_on_card

    return measure_on_card()["values"][key]


CLAIMS = [
    exact("greedy tokens, attention=\"triton\" vs \"reference\", 5 requests, 3 slots, "
          "9 four-token blocks", tokens),
    exact("kernel calls in the triton run", kernel_calls),
    exact("attention calls in the triton run's prefill steps (2 layers each): packed prefill / "
          "reference",
          prefill_calls),
    exact("block ids the engine handed the kernel vs the frozen snapshot's, per call",
          block_ids_agree),
    exact("a 512-token prompt through the kernel: pool cells read per KV head and layer, "
          "counted from its output", prefill_reads),
    exact("the snapshot's closed form `prefix_cells_read(512)` against that count",
          prefill_reads_formula),
    exact("kernel configurations compiled to cubin for GPUTarget(\"cuda\", 90, 32) on this CPU",
          compiled),
    exact("the package's list of configurations vs the frozen snapshot's", configs_agree),
    gpu("expected on a card: bf16, Llama-3.2-1B attention, 64 rows × 1,024: gathered time / "
        "kernel time",
        "kernel.json", "gathered_over_kernel_64x1024",
        measure=functools.partial(_card, "gathered_over_kernel_64x1024"), fmt="{:.2f}x".format),
    gpu("expected on a card: bf16, 1 row × 4,096 (split-K): gathered time / kernel time",
        "kernel.json", "gathered_over_kernel_1x4096",
        measure=functools.partial(_card, "gathered_over_kernel_1x4096"), fmt="{:.2f}x".format),
    gpu("expected on a card: bf16 kernel vs the float32 reference, max relative error, every bf16 "
        "configuration", "kernel.json", "bf16_max_rel_error",
        measure=functools.partial(_card, "bf16_max_rel_error"), fmt="{:.1e}".format),
]

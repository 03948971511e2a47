"""Day 62 on a card: the kernel against the gathered path, and bf16 against float32.

    python -m chapters.day62_kernel_in_engine.bench \
        --out chapters/day62_kernel_in_engine/results/kernel.json

On a CUDA machine this times ``nanoserve.cuda.kernels.paged_attention`` against
``paged_attention_gathered`` (Day 50) on Llama-3.2-1B's attention shape (32 query heads, 8 KV
heads, head_dim 64, bf16, 16-token blocks) at 64 rows × 1,024 tokens (one pass) and 1 row ×
4,096 (split-K), best of interleaved rounds of CUDA-event timings, and measures the bf16
kernel's worst relative error against the float32 reference over every bf16 configuration of
``tools.kernel_aot``. It writes the results file Day 62's gpu claims read, naming device,
torch, CUDA, date and command. The chapter's claims call ``measure_on_card`` directly when a
card is present. On a CPU, ``--smoke`` runs the same code on a toy float32 shape (interpreter),
to check the plumbing; it writes nothing.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
import time
from pathlib import Path

import torch

from chapters.day60_paged_kernel.claims import case, reference, rel

SHAPES = {"64x1024": (64, 1024), "1x4096": (1, 4096)}


def _gathered_inputs(cells: torch.Tensor, lens: list[int], C: int = 32):
    """Day 50's mapping for these rows: (n, C) chunk cells (-1 padding), each chunk's row."""
    chunks, owner = [], []
    for r, n in enumerate(lens):
        for s in range(0, n, C):
            row = torch.full((C,), -1, dtype=torch.long)
            row[:min(C, n - s)] = cells[r, s:min(n, s + C)].cpu()
            chunks.append(row)
            owner.append(r)
    return torch.stack(chunks), torch.tensor(owner)


def _clock(fn, device: str, reps: int) -> float:
    """Seconds per call, after one warm-up call."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def speedup(rows: int, ctx: int, device: str, rounds: int = 5, reps: int = 20,
            hkv: int = 8, group: int = 4, head_dim: int = 64,
            dtype: torch.dtype = torch.bfloat16) -> float:
    """gathered time / kernel time, each its best over interleaved rounds."""
    from nanoserve.attention.backends.gathered import paged_attention_gathered
    from nanoserve.cuda.kernels import paged_attention

    lens = [ctx] * rows
    q, k, v, tables, cells, lens_t = (t.to(device) for t in case(
        lens, 16, hkv, group, head_dim, extra_width=0, dtype=dtype))
    gcells, chunk_b = (t.to(device) for t in _gathered_inputs(cells, lens))
    q1 = q[:, :, 0]
    if rel(paged_attention(q, k, v, tables, lens_t, 16)[:, :, 0],
           paged_attention_gathered(q1, k, v, gcells, chunk_b)) > 2e-2:
        raise RuntimeError("the kernel and the gathered path disagree")
    best = {"gathered": float("inf"), "kernel": float("inf")}
    for _ in range(rounds):
        best["gathered"] = min(best["gathered"], _clock(
            lambda: paged_attention_gathered(q1, k, v, gcells, chunk_b), device, reps))
        best["kernel"] = min(best["kernel"], _clock(
            lambda: paged_attention(q, k, v, tables, lens_t, 16), device, reps))
    return best["gathered"] / best["kernel"]


def bf16_error(device: str, configs=None) -> float:
    """Worst relative error of the bf16 kernel against the float32 reference, decode and
    prefill, one pass and split, over ``tools.kernel_aot``'s bf16 configurations."""
    from nanoserve.cuda.kernels import paged_attention
    from tools.kernel_aot import configurations

    worst = 0.0
    for c in configs or configurations(("bfloat16",)):
        lens = [1, 5 * c.block_size + 3, 300, 77]
        q, k, v, tables, cells, ctx = (t.to(device) for t in case(
            lens, c.block_size, 2, c.group, c.head_dim, dtype=torch.bfloat16))
        out = paged_attention(q, k, v, tables, ctx, c.block_size, splits=5 if c.split else 1,
                              tile=c.tile)
        worst = max(worst, rel(out, reference(q, k, v, cells, ctx)))
    return worst


@functools.cache
def measure_on_card() -> dict:
    if not torch.cuda.is_available():
        raise RuntimeError("measure_on_card needs CUDA")
    values = {f"gathered_over_kernel_{name}": speedup(*shape, "cuda")
              for name, shape in SHAPES.items()}
    values["bf16_max_rel_error"] = bf16_error("cuda")
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": datetime.date.today().isoformat(),
            "command": "python -m chapters.day62_kernel_in_engine.bench --out "
                       "chapters/day62_kernel_in_engine/results/kernel.json",
            "workload": "Llama-3.2-1B attention: 32 query heads, 8 KV heads, head_dim 64, "
                        "bf16, 16-token blocks; rows x tokens as keyed; best of 5 rounds of 20",
            "values": values}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m chapters.day62_kernel_in_engine.bench")
    ap.add_argument("--out", type=Path, help="where to write the results JSON")
    ap.add_argument("--smoke", action="store_true", help="a toy shape on this machine")
    args = ap.parse_args(argv)
    if args.smoke:
        from tools.kernel_aot import configurations

        device = "cuda" if torch.cuda.is_available() else "cpu"
        # float32 on a CPU: the interpreter does not run the bf16 kernel faithfully
        s = speedup(2, 40, device, rounds=1, reps=1, hkv=2, group=2, head_dim=32,
                    dtype=torch.bfloat16 if device == "cuda" else torch.float32)
        e = bf16_error(device, configurations(("bfloat16",))[:2]) if device == "cuda" else None
        print(f"smoke on {device}: gathered/kernel {s:.3f}x, bf16 error {e}")
        return 0
    data = measure_on_card()
    print(json.dumps(data, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

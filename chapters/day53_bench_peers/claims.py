"""Day 53's numbers: the bench's workload, a reduced three-engine run here, and the full table.

The workload rows are counted by the frozen snapshot and held against the package's own
``make_workload``: 16 seeded requests (prompts of 16-192 tokens, 16-128 new tokens, vocabulary
2,048), at most 8 rows at a time.

The reduced run is ``run_offline`` on the shipped nanoserve-tiny in float32, one torch thread,
6 requests (prompts 8-48 tokens, 4-24 new tokens), 4 rows at a time, one round: nanoserve,
transformers' ``generate`` in static waves and transformers' continuous batching. It checks the
harness (every engine must produce nanoserve's greedy tokens) and is not timed.

The ``recorded`` rows read the full runs, written on this machine by::

    nanoserve bench offline --shape smollm2-135m --dtype bfloat16 --requests 16 \\
        --engines nanoserve,hf,hf-cb,vllm --threads 1 --rounds 3 --json
    nanoserve bench offline --shape smollm2-135m --dtype float32 ...   (the same otherwise)
    nanoserve bench offline --dtype float32 ...                         (nanoserve-tiny)

and kept as ``results/offline-<model>-<dtype>.json`` with the machine, the date, the command,
the load average and the whole report.
"""

from __future__ import annotations

import functools

from chapters.runner import exact, recorded, timed

from .snapshot.workload import make_workload, wave_accounting

REQUESTS, BATCH = 16, 8
REDUCED = dict(requests=6, prompt_lens=(8, 48), gen_lens=(4, 24))
REDUCED_BATCH = 4
PEERS = ("hf", "hf-cb")


def accounting() -> dict[str, int]:
    return wave_accounting(make_workload(REQUESTS).max_tokens, BATCH)


def package_agrees() -> str:
    from nanoserve.bench.workload import make_workload as live
    from nanoserve.bench.workload import wave_accounting as live_accounting

    mine, theirs = make_workload(REQUESTS), live(REQUESTS)
    same = (mine.prompts == theirs.prompts and mine.max_tokens == theirs.max_tokens
            and live_accounting(theirs.max_tokens, BATCH) == accounting())
    return "identical" if same else "different"


@functools.cache
def reduced() -> dict[str, dict]:
    from chapters.common import one_thread
    from nanoserve.bench.adapters import Setup
    from nanoserve.bench.runner import run_offline
    from nanoserve.bench.workload import make_workload
    from nanoserve.llm import DEFAULT_MODEL

    wl = make_workload(**REDUCED)
    setup = Setup(model=DEFAULT_MODEL, dtype="float32", device="cpu", batch=REDUCED_BATCH,
                  max_model_len=wl.max_len)
    with one_thread():
        report = run_offline(setup, wl, engines=("nanoserve", *PEERS), rounds=1)
    return {row["engine"]: row for row in report["rows"]}


# SmolLM2-135M's projections (in, out) and its tied LM head: what prepack packs, 8 decode rows.
PROJECTIONS = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072),
               "down": (1536, 576), "lm head": (576, 49152)}
ROWS = 8


def packing_dtype():
    """The dtype the packing rows measure: bf16, what ``prepack`` packs by default on a CPU,
    where this CPU's oneDNN has a bf16 kernel; float32 where it has none (an AVX2-only x86),
    since oneDNN's float32 linear reorders a weight as loaded on every call just the same."""
    import torch

    from nanoserve.cpu.onednn import unavailable

    cpu = torch.device("cpu")
    return torch.bfloat16 if unavailable(cpu, torch.bfloat16) is None else torch.float32


def _linear_pair(k: int, n: int):
    """(x, w, loaded, packed): ``loaded`` is oneDNN's linear on the weight as loaded (in bf16,
    the call ``F.linear`` makes on a CPU), ``packed`` the same linear on the weight reordered
    once, as ``prepack`` does at load."""
    import torch

    from nanoserve.layers.linear_onednn import packed_layer

    dtype = packing_dtype()
    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, k, generator=g).to(dtype)  # (N, E)
    x = torch.randn(ROWS, k, generator=g).to(dtype)  # (B, E)

    def loaded(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return x, w, loaded, packed_layer(w)


def packing_here() -> str | None:
    """Why this CPU cannot run oneDNN's packed linear in any dtype (a torch build without
    oneDNN), or None."""
    import torch

    from nanoserve.cpu.onednn import unavailable

    return unavailable(torch.device("cpu"), torch.float32)


def packed_identical() -> str:
    import torch

    same = 0
    with torch.inference_mode():
        for k, n in PROJECTIONS.values():
            x, _, loaded, packed = _linear_pair(k, n)
            same += torch.equal(loaded(x), packed(x))
    return f"{same} of {len(PROJECTIONS)}"


def head_speedup() -> float:
    """oneDNN's time on the LM head as loaded / on the packed head, best of 5 interleaved
    rounds of 10 calls."""
    import time

    import torch

    from chapters.common import best_of

    x, _, loaded, packed = _linear_pair(*PROJECTIONS["lm head"])

    def arm(f, *args):
        def run() -> float:
            with torch.inference_mode():
                f(*args)
                t = time.perf_counter()
                for _ in range(10):
                    f(*args)
                return time.perf_counter() - t
        return run

    best = best_of(5, {"loaded": arm(loaded, x), "packed": arm(packed, x)}, lambda s: s)
    return best["loaded"] / best["packed"]


def same_tokens(engine: str) -> str:
    row = reduced()[engine]
    if row["status"] != "ok":
        return f"{row['status']}: {row['reason']}"
    return f"{row['same_tokens_as_nanoserve']} of {REDUCED['requests']}"


RATIO = "{:.2f}x".format
BF16, FP32, TINY = ("offline-smollm2-135m-bfloat16.json", "offline-smollm2-135m-float32.json",
                    "offline-tiny-float32.json")
SHAPE = "SmolLM2-135M shape, 16 requests, 8 rows, 1 thread each, 2-core x86 CPU"
PACKING_DTYPE = "bf16 (float32 where oneDNN has no bf16 kernel)"
PACKED_ON = f"SmolLM2-135M's four projections and LM head, 8 rows, {PACKING_DTYPE}"

CLAIMS = [
    exact("useful tokens the 16 requests ask for", lambda: accounting()["useful_tokens"]),
    exact("row-steps static waves of 8 decode for them", lambda: accounting()["computed_tokens"]),
    exact("share of those row-steps that are waste",
          lambda: accounting()["wasted_tokens"] / accounting()["computed_tokens"],
          fmt="{:.1%}".format),
    exact("the package's workload and accounting against the snapshot's", package_agrees),
    exact("requests where transformers' generate gives nanoserve's tokens (reduced run)",
          lambda: same_tokens("hf")),
    exact("requests where transformers' continuous batching gives nanoserve's tokens "
          "(reduced run)", lambda: same_tokens("hf-cb")),
    recorded(f"nanoserve / transformers generate, bf16, {SHAPE}", BF16, "ratio_hf", fmt=RATIO),
    recorded(f"nanoserve / transformers continuous batching, bf16, {SHAPE}", BF16,
             "ratio_hf_cb", fmt=RATIO),
    recorded(f"nanoserve / vLLM CPU 0.32, bf16, {SHAPE}", BF16, "ratio_vllm", fmt=RATIO),
    recorded(f"nanoserve / transformers generate, float32, {SHAPE}", FP32, "ratio_hf", fmt=RATIO),
    recorded(f"nanoserve / transformers continuous batching, float32, {SHAPE}", FP32,
             "ratio_hf_cb", fmt=RATIO),
    recorded(f"nanoserve / vLLM CPU 0.32, float32, {SHAPE}", FP32, "ratio_vllm", fmt=RATIO),
    recorded("nanoserve / transformers generate, float32, nanoserve-tiny, 16 requests, 8 rows",
             TINY, "ratio_hf", fmt=RATIO),
    recorded("nanoserve / transformers continuous batching, float32, nanoserve-tiny, "
             "16 requests, 8 rows", TINY, "ratio_hf_cb", fmt=RATIO),
    recorded("nanoserve / vLLM CPU 0.32, float32, nanoserve-tiny, 16 requests, 8 rows", TINY,
             "ratio_vllm", fmt=RATIO),
    exact(f"oneDNN's linear on packed weights vs on the weights as loaded, {PACKED_ON}: "
          "bit-identical outputs", packed_identical, needs=packing_here),
    timed(f"LM head 576 -> 49152, {PACKING_DTYPE}, 8 rows, one thread, 2-core x86 CPU: "
          "oneDNN's time on the weight as loaded / on the packed weight", head_speedup,
          needs=packing_here),
]

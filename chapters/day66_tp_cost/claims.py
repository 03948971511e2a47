"""Day 66's numbers: the bytes each collective moves in a decode step, counted and held against
the frozen cost model; the cost model on SmolLM2-135M's shape; rank 0's decode step split into
time inside collectives and the rest; and 2 ranks x 1 thread against 1 rank x 2 threads.

The counts come from rank 0's ``CommStats`` on the shipped nanoserve-tiny in float32 over gloo
on 127.0.0.1. The throughput rows are timed: ``make chapter-66`` measures the tiny one in
interleaved rounds; the SmolLM2-135M-shape rows are read from the results files that
``nanoserve bench tp`` wrote (each names its machine, date and command).
"""

from __future__ import annotations

import functools

from chapters.common import SHIPPED
from chapters.runner import exact, recorded, timed

from .snapshot.cost import step_bytes

ROWS, STEPS = 8, 32


@functools.cache
def split() -> dict:
    from nanoserve import LLM
    from nanoserve.bench.tpbench import step_split

    with LLM(SHIPPED, dtype="float32", tensor_parallel_size=2, max_num_seqs=ROWS) as llm:
        return step_split(llm, ROWS, STEPS)


def calls() -> str:
    c = split()["calls_per_step"]
    return f"{c['all_reduce']} all-reduces, {c['gather']} gather, {c['broadcast']} broadcast"


def measured_bytes() -> str:
    s = split()
    b = s["bytes_per_step"]
    embed = b["all_reduce"] - s["layers"] * s["all_reduce_bytes_per_layer"]
    return (f"all-reduce {b['all_reduce']:,} B ({s['all_reduce_bytes_per_layer']:,} B a layer, "
            f"{embed:,} B the embedding's); gather {b['gather']:,} B; broadcast "
            f"{b['broadcast']:,} B")


def _tiny() -> dict:
    import json

    return json.loads((SHIPPED / "config.json").read_text())


def model_agrees() -> str:
    cfg, s = _tiny(), split()
    model = step_bytes(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"], ROWS, 2,
                       act_bytes=4)
    kinds = ("all_reduce", "gather", "broadcast")
    same = sum(model[k] == s["bytes_per_step"][k] for k in kinds)
    same_calls = model["all_reduces"] == s["calls_per_step"]["all_reduce"]
    verdict = "agrees" if same_calls else "differs"
    return f"{same} of {len(kinds)} collectives' bytes; all-reduce count {verdict}"


def smollm2_model() -> str:
    from nanoserve.bench.shapes import shape_config

    c = shape_config("smollm2-135m")
    out = []
    for name, size in (("float32", 4), ("bfloat16", 2)):
        b = step_bytes(c["num_hidden_layers"], c["hidden_size"], c["vocab_size"], ROWS, 2, size)
        out.append(f"{name}: all-reduce {b['all_reduce']:,} B ({b['all_reduce_per_layer']:,} B a "
                   f"layer), gather {b['gather']:,} B")
    return "; ".join(out)


def smollm2_collectives() -> str:
    """The cost model's count of collectives in one decode step on SmolLM2-135M's shape."""
    from nanoserve.bench.shapes import shape_config

    c = shape_config("smollm2-135m")
    b = step_bytes(c["num_hidden_layers"], c["hidden_size"], c["vocab_size"], ROWS, 2, 4)
    return f"{b['all_reduces']} all-reduces, 1 gather, 1 broadcast: {b['all_reduces'] + 2} in all"


def two_cores() -> str | None:
    """The timed rows' condition: no core to spare. Each rank's one thread shares its core with
    gloo's I/O threads, and that is where the collectives' time goes; with idle cores beside the
    ranks the balance could change, and these rows do not say how."""
    import os

    n = len(os.sched_getaffinity(0))
    return None if n <= 2 else f"needs a CPU with at most 2 usable cores (this one has {n})"


def tiny_ratio() -> float:
    from nanoserve.bench.tpbench import run

    return run(SHIPPED, "float32", 2, rounds=2, requests=16, batch=ROWS, decode_steps=8)["ratio"]


def two_gpus() -> str | None:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return None if n >= 2 else f"needs 2 GPUs (this machine has {n})"


def nccl_identical() -> str:
    from nanoserve import LLM, SamplingParams

    prompts = ["The while statement", "Once upon a time", "def f(x):", "A list is"]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    one = LLM(SHIPPED, dtype="float32", device="cuda").generate(prompts, params)
    with LLM(SHIPPED, dtype="float32", device="cuda", tensor_parallel_size=2) as llm:
        two = llm.generate(prompts, params)
    same = sum(a.token_ids == b.token_ids for a, b in zip(one, two, strict=True))
    return f"{same} of {len(prompts)} identical"


SMOL = "tp-smollm2-135m-{}.json"  # under results/, where the runner looks
CLAIMS = [
    exact("collectives rank 0 runs per decode step, nanoserve-tiny float32, -tp 2, 8 rows",
          calls),
    exact("bytes per decode step at 8 rows, as CommStats counted them", measured_bytes),
    exact("the frozen cost model against CommStats", model_agrees),
    exact("the cost model on SmolLM2-135M's shape (30 layers, hidden 576, vocabulary 49152), 8 "
          "rows, -tp 2", smollm2_model),
    exact("the cost model's collectives per decode step, SmolLM2-135M shape",
          smollm2_collectives),
    timed("share of rank 0's decode step inside collectives, nanoserve-tiny float32, 8 rows, "
          "gloo, 2 ranks x 1 thread, a 2-core CPU", lambda: split()["comm_share"],
          fmt="{:.0%}".format, needs=two_cores),
    timed("throughput, 2 ranks x 1 thread / 1 rank x 2 threads, nanoserve-tiny float32, 16 "
          "requests, batch 8, a 2-core CPU", tiny_ratio, fmt="{:.2f}x".format, needs=two_cores),
    recorded("throughput, 2 ranks x 1 thread / 1 rank x 2 threads, SmolLM2-135M shape float32, "
             "16 requests, batch 8", SMOL.format("float32"), "ratio", fmt="{:.2f}x".format),
    recorded("throughput, 2 ranks x 1 thread / 1 rank x 2 threads, SmolLM2-135M shape bfloat16, "
             "16 requests, batch 8", SMOL.format("bfloat16"), "ratio", fmt="{:.2f}x".format),
    recorded("share of rank 0's decode step inside collectives, SmolLM2-135M shape float32, 8 "
             "rows", SMOL.format("float32"), "comm_share", fmt="{:.0%}".format),
    exact("NCCL across 2 cards: greedy tokens, -tp 2 against -tp 1, nanoserve-tiny float32, 4 "
          "prompts x 32 tokens", nccl_identical, needs=two_gpus),
]

"""Day 57's numbers: the capture list, the counters on the worst shape over free rows, padding,
the static buffers and their addresses, and the capture on a card.

Model rows run nanoserve-tiny in float32 on one torch thread, windows in eager replay (no CUDA
here). "Worst shape" is 8 slots, 16 requests with 4-token prompts and generation lengths
4/8/16/32, greedy, EOS ignored, over free rows; Day 58's claims call ``worst(True)`` for the
same windows with its persistent batch. The gpu rows state what a card is expected to show: they
are measured only where CUDA is present (``bench.py``), read from ``results/capture.json`` once a
card's ``make gpu-check`` has written it, and skipped until then.
"""

from __future__ import annotations

import functools

from chapters.common import SHIPPED, one_thread
from chapters.runner import bound, exact, gpu

from .snapshot import windows as snap

SLOTS, REQUESTS, GEN = 8, 16, (4, 8, 16, 32)
PROMPTS = [[0, 5 + i, 9, 11] for i in range(REQUESTS)]


def params():
    from nanoserve import SamplingParams

    return [SamplingParams(temperature=0, max_tokens=GEN[i % len(GEN)], ignore_eos=True)
            for i in range(REQUESTS)]


def capture_lists() -> str:
    from nanoserve.cuda.graphs import capture_sizes

    return "; ".join(f"{n}: {capture_sizes(n)}" for n in (1, 6, 8, 12))


def buckets() -> str:
    from nanoserve.cuda.graphs import bucket_for, capture_sizes

    sizes = capture_sizes(SLOTS)
    return ", ".join(str(bucket_for(n, sizes)) for n in range(1, SLOTS + 2))


def frozen_lists() -> str:
    from nanoserve.cuda.graphs import bucket_for, capture_sizes

    same = sum(capture_sizes(n) == snap.capture_sizes(n)
               and all(bucket_for(k, capture_sizes(n)) == snap.bucket_for(k, capture_sizes(n))
                       for k in range(1, n + 2))
               for n in range(1, 65))
    return f"{same} of 64 agree"


def prefix() -> str:
    from nanoserve.cuda.graphs import rows_are_a_prefix

    return ", ".join("yes" if rows_are_a_prefix(r) else "no"
                     for r in ((2, 0, 1), (0, 2), (1,)))


@functools.cache
def worst(compact: bool) -> dict:
    from nanoserve import LLM

    with one_thread():
        llm = LLM(SHIPPED, dtype="float32", max_num_seqs=SLOTS, max_model_len=64,
                  skip_tokenizer_init=True, cuda_graphs=True, compact_rows=compact,
                  enable_chunked_prefill=False, attention="gathered")  # its 7 buffers
        g = llm.engine.graphs
        before = g._current_addresses()
        llm.generate(PROMPTS, params())
    s = llm.stats
    return {"steps": s.decode_steps, "replayed": s.decode_steps_replayed,
            "scattered": s.decode_steps_scattered, "share": s.replay_share,
            "padded": g.padded_rows, "by_bucket": dict(g.by_bucket), "replays": g.replays,
            "same": sum(before[k] == v for k, v in g._current_addresses().items()),
            "addresses": len(before), "buffers": g.buffers, "mode": g.mode}


def counters(compact: bool) -> str:
    w = worst(compact)
    return (f"{w['steps']} decode steps: {w['replayed']} replayed, {w['scattered']} scattered, "
            f"{w['share']:.0%}")


def padding(compact: bool) -> str:
    w = worst(compact)
    used = ", ".join(f"{b}: {n}" for b, n in w["by_bucket"].items() if n)
    return f"{w['padded']} padded rows; windows by bucket {used}"


def buffer_bytes() -> str:
    """Read from the tensors the engine allocated, not from a formula."""
    t = worst(False)["buffers"].tensors()
    parts = [f"{k} {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')} "
             f"{v.numel() * v.element_size():,} B" for k, v in t.items()]
    total = sum(v.numel() * v.element_size() for v in t.values())
    return "; ".join(parts) + f"; {total:,} bytes"


def frozen_bytes() -> str:
    import torch

    pkg = worst(False)["buffers"]
    frozen = snap.StaticBuffers(SLOTS, pkg.hidden.shape[1], 64, torch.float32)
    shapes = all(tuple(frozen.tensors()[k].shape) == tuple(v.shape)
                 for k, v in pkg.tensors().items())
    total = sum(v.numel() * v.element_size() for v in pkg.tensors().values())
    return f"{frozen.nbytes():,} against {total:,}, shapes {'equal' if shapes else 'differ'}"


def addresses() -> str:
    w = worst(False)
    return f"{w['same']} of {w['addresses']} unchanged after {w['replays']} replays"


@functools.cache
def three_rows() -> dict:
    """Rows 0, 1, 2 of a four-slot engine step through the bucket-4 window, held against the
    eager forward on the same cache state."""
    import torch

    from nanoserve import LLM

    with one_thread(), torch.inference_mode():
        llm = LLM(SHIPPED, dtype="float32", max_num_seqs=4, max_model_len=64, block_size=4,
                  skip_tokenizer_init=True, cuda_graphs=True)
        e = llm.engine
        lists = [[0, 5, 9], [0, 7, 8, 9, 10, 11], [0, 3]]
        for row, toks in enumerate(lists):
            e.grant(row, len(toks) + 4)
        e.prefill([0, 1, 2], lists)
        cache = e.cache
        lengths = {r: cache.lengths[r] for r in range(3)}
        cells = {r: cache.tables[r].cells(lengths[r], lengths[r] + 1)[0] for r in range(3)}
        k, v, slots = cache.k.clone(), cache.v.clone(), cache.slots.cells.clone()
        want = e._forward([2, 0, 1], [[4], [6], [12]])
        cache.k.copy_(k)
        cache.v.copy_(v)
        cache.slots.cells.copy_(slots)
        for row in range(3):
            cache.lengths[row] -= 1
        got = e.decode([2, 0, 1], [4, 6, 12])
        written = (cache.k != k).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
        refused = ""
        try:
            e.graphs.replay([0, 2], [1, 2])
        except ValueError as err:
            refused = type(err).__name__
        e.decode([0, 2], [1, 2])  # the engine asks first and falls through
    return {"err": (got - want).abs().max().item(), "g": e.graphs, "written": written,
            "cells": sorted(cells.values()), "pad_row_empty": bool((slots[3] == -1).all()
                                                               and (cache.slots.cells[3] == -1)
                                                               .all()),
            "inputs": e.graphs.buffers.inputs[:, :4].tolist(),
            "frozen": snap.host_inputs([2, 0, 1], [4, 6, 12], lengths, cells, 4),
            "refused": refused, "scattered": e.replay_counters.scattered}


def padded_step() -> str:
    t = three_rows()
    g = t["g"]
    return (f"bucket {max(b for b, n in g.by_bucket.items() if n)}, {g.padded_rows} padded "
            f"row; K/V cells written {len(t['written'])}, all the real rows' "
            f"({t['written'] == t['cells']}); pad row's slot row empty ({t['pad_row_empty']})")


def frozen_copy_in() -> str:
    t = three_rows()
    return "identical" if t["inputs"] == t["frozen"] else f"differ: {t['inputs']}"


def not_a_prefix() -> str:
    t = three_rows()
    return f"window refuses ({t['refused']}); engine falls through, {t['scattered']} scattered"


def moved_buffer() -> str:
    import torch

    from nanoserve import LLM

    llm = LLM(SHIPPED, dtype="float32", max_num_seqs=4, max_model_len=64, block_size=4,
              skip_tokenizer_init=True, cuda_graphs=True)
    e = llm.engine
    e.grant(0, 8)
    with torch.inference_mode():
        e.prefill([0], [[0, 5, 9]])
        e.graphs.buffers.hidden = e.graphs.buffers.hidden.clone()  # a careless resize
        try:
            e.decode([0], [4])
        except AssertionError as err:
            return f"AssertionError: {err}"
    return "replayed anyway"


# ---- on a card: bench.py measures these where CUDA is present (make gpu-check's "capture"
# stage writes them to results/capture.json); anywhere else they are read from that file, or
# are skipped while it does not exist.


def card(key: str):
    from .bench import capture_run

    return capture_run("cuda")[key]


CLAIMS = [
    exact("capture lists for max_num_seqs 1, 6, 8, 12", capture_lists),
    exact("bucket for 1 to 9 rows, max_num_seqs 8", buckets),
    exact("the frozen capture list and buckets against the package, max_num_seqs 1-64",
          frozen_lists),
    exact("does a step replay? rows (2, 0, 1), (0, 2), (1,)", prefix),
    exact("worst shape, windows over free rows", lambda: counters(False)),
    exact("worst shape, free rows: padding", lambda: padding(False)),
    exact("static buffers for 8 rows, max_model_len 64, float32 (read from the tensors)",
          buffer_bytes),
    exact("the frozen StaticBuffers against the package's, same sizes", frozen_bytes),
    exact("addresses the windows hold (4 buffers, slot table, K, V), worst shape", addresses),
    exact("a buffer replaced after the windows were made, next replay", moved_buffer),
    exact("3 rows (2, 0, 1) through the window of a 4-slot engine", padded_step),
    bound("3 rows through the window: max abs logit difference from the eager forward",
          lambda: three_rows()["err"]),
    exact("that step's copy-in against the frozen `host_inputs`", frozen_copy_in),
    exact("rows (0, 2) asked of the window", not_a_prefix),
    gpu("expected on a card: windows captured, max_num_seqs 8", "capture.json", "captured",
        measure=lambda: card("captured")),
    gpu("expected on a card: worst shape, captured windows vs the eager forward",
        "capture.json", "differ", measure=lambda: card("differ"),
        fmt=lambda n: f"{n} of {REQUESTS} requests differ"),
    gpu("expected on a card: worst shape, replay share", "capture.json", "share",
        measure=lambda: card("share"), fmt="{:.0%}".format),
    gpu("expected on a card: addresses unchanged across the replays", "capture.json",
        "addresses", measure=lambda: card("addresses"),
        fmt=lambda a: f"{a['same']} of {a['held']}"),
]

"""Day 52's numbers: which dtype "auto" picks for which processor, what stays float32, how far
bf16 logits move from transformers' fp32 ones, and what bf16 buys a decode step on this CPU.

Flag rows feed chosen flag sets to the package (``nanoserve.model.weights.cpu_flags`` swapped
for the duration) and hold it against the frozen rule, so they read the same on any machine.
Error rows run nanoserve-tiny against transformers' own Llama on the same folder. The timed row
uses random weights in SmolLM2-135M's shape (``nanoserve.bench.shapes.shape_checkpoint``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import itertools
import logging
import tempfile
import time
import types
from pathlib import Path

import torch

from chapters.common import ROOT, SHIPPED, best_of, one_thread
from chapters.runner import bound, exact, timed

from .snapshot import dtype as snap

FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
EXAMPLES = ({"avx512f", "avx512_bf16"}, {"amx_bf16", "amx_tile"}, {"avx2", "avx512f"})
TEXT = ("The with statement wraps a block in the methods of a context manager: __enter__ runs "
        "before the block and its result is bound to the name after as, and __exit__ runs "
        "after it, whether the block finished normally or raised. A list comprehension builds "
        "a new list from an iterable in one expression, with an optional condition that "
        "filters the items it keeps.")


TWO_MACHINES = ({8: 2.0, 64: 2.0}, {8: 0.83, 64: 0.83})  # bf16/fp32, as quoted in the prose


@contextlib.contextmanager
def cpu_with(flags: set[str], ratios: dict[int, float] | None = None):
    """The package sees ``flags`` as this processor's /proc/cpuinfo flags and, with ``ratios``,
    this fp32/bf16 time ratio per batch size as its load-time measurement (in a scratch cache,
    so the real verdict in build/dtype_auto.json is neither read nor written)."""
    from nanoserve.cpu import auto_dtype
    from nanoserve.model import weights

    real = weights.cpu_flags, auto_dtype.measure, auto_dtype.cache_path
    weights.cpu_flags = lambda: set(flags)
    with tempfile.TemporaryDirectory() as scratch:
        if ratios is not None:
            auto_dtype.measure = lambda hidden, intermediate, kernel=True, onednn=True: dict(ratios)
            auto_dtype.cache_path = lambda: Path(scratch) / "dtype_auto.json"
        try:
            yield
        finally:
            weights.cpu_flags, auto_dtype.measure, auto_dtype.cache_path = real


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def examples() -> str:
    """The frozen rule: what Day 52 shipped, flags in, dtype out."""
    return "; ".join(name(snap.resolve_dtype("auto", flags)) for flags in EXAMPLES)


def agreement() -> str:
    """Every subset of FLAGS x the checkpoint's dtype x what was asked, on a card and a CPU,
    except auto on a CPU (the one case the package now measures instead of reading flags)."""
    from nanoserve.model.weights import resolve_dtype

    agree = total = 0
    for k in range(len(FLAGS) + 1):
        for subset in itertools.combinations(FLAGS, k):
            flags = set(subset)
            for device, ckpt, asked in itertools.product(
                    ("cpu", "cuda"), ("float32", "bfloat16"), ("auto", "float32", "bfloat16")):
                if (device, asked) == ("cpu", "auto"):
                    continue
                with cpu_with(flags):
                    live = resolve_dtype(asked, types.SimpleNamespace(torch_dtype=ckpt), device)
                total += 1
                agree += live == snap.resolve_dtype(asked, flags, device, ckpt)
    return f"{agree} of {total} agree"


def same_flags() -> str:
    """The package's auto on two CPUs with the same flags and different measurements."""
    from nanoserve.model.weights import resolve_dtype

    got = []
    for ratios in TWO_MACHINES:
        with cpu_with({"avx512f", "avx512_bf16"}, ratios):
            got.append(name(resolve_dtype("auto", None, "cpu")))
    return "; ".join(got)


def auto_llm(flags: set[str] | None = None, ratios: dict[int, float] | None = None):
    """``LLM(dtype="auto")`` on the shipped model and the log line it wrote."""
    from nanoserve import LLM

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("nanoserve")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with cpu_with(flags, ratios) if flags is not None else contextlib.nullcontext():
            llm = LLM(SHIPPED, dtype="auto", max_model_len=64)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return llm, next(line for line in lines if line.startswith("dtype="))


def log_lines() -> str:
    return "; ".join(auto_llm({"avx512f", "avx512_bf16"}, r)[1] for r in TWO_MACHINES)


def this_machine() -> str:
    """The live choice on the CPU running the claims, against its own cached verdict."""
    from nanoserve.cpu import auto_dtype

    llm, line = auto_llm()
    want = auto_dtype.choose(llm.config.hidden_size, llm.config.intermediate_size)
    if (llm.dtype, llm.dtype_reason) != want:
        return f"differs: {line}"
    if name(llm.dtype) not in line or llm.dtype_reason not in line:
        return f"agrees, but the log line does not say so: {line}"
    return "agrees; the log line names the dtype and the measured ratio"


def float32_stays() -> str:
    """A bf16 engine: its weights and KV cache, and every logits tensor it hands the sampler."""
    from nanoserve import LLM, SamplingParams

    llm = LLM(SHIPPED, dtype="bfloat16", max_model_len=64, skip_tokenizer_init=True)
    e, seen = llm.engine, set()

    def spy(f):
        def call(*a, **k):
            out = f(*a, **k)
            seen.add(name(out.dtype))
            return out
        return call

    e.prefill, e.decode = spy(e.prefill), spy(e.decode)
    with one_thread():
        llm.generate([[0, 5, 9, 11], [0, 7]], SamplingParams(temperature=0, max_tokens=4))
    return (f"{name(llm.model.embed_tokens.weight.dtype)}, {name(e.cache.k.dtype)}, "
            f"{'/'.join(sorted(seen))}")


@functools.cache
def errors() -> dict:
    """nanoserve-tiny on 64 tokens of text: last-layer logits at every position."""
    from nanoserve.model.weights import load_model
    from nanoserve.testing import load_hf_model, relative_logit_error
    from nanoserve.tokenizer import Tokenizer

    ids = torch.tensor([Tokenizer.from_dir(SHIPPED).encode(TEXT, add_special_tokens=False)[:64]])
    pos = torch.arange(ids.shape[1])[None]
    with torch.no_grad(), one_thread():
        ref = load_hf_model(SHIPPED)
        want = ref(ids).logits[0]
        theirs16 = ref.to(torch.bfloat16)(ids).logits[0]
        ours = {}
        for dtype in ("float32", "bfloat16"):
            m = load_model(SHIPPED, dtype)
            ours[dtype] = m.compute_logits(m(ids, pos))[0]
    return {"positions": ids.shape[1],
            "ours16": relative_logit_error(ours["bfloat16"], want),
            "theirs16": relative_logit_error(theirs16, want),
            "ours32": relative_logit_error(ours["float32"], want),
            "argmax": (ours["bfloat16"].argmax(-1) == want.argmax(-1)).float().mean().item()}


def pinned() -> str:
    """``LLM(...)`` calls in tests/test_parity.py (tokens against transformers) that say
    ``dtype="float32"`` rather than leave it to "auto"."""
    tree = ast.parse((ROOT / "tests" / "test_parity.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "LLM"]
    pins = sum(any(k.arg == "dtype" and getattr(k.value, "value", None) == "float32"
                   for k in c.keywords) for c in calls)
    return f"{pins} of {len(calls)}"


@torch.inference_mode()
def decode_speedup(requests: int = 64, steps: int = 8, rounds: int = 3) -> float:
    """bf16 over fp32 decode throughput: two engines on one checkpoint, the same requests,
    decode steps timed (the prefill is not), rounds interleaved."""
    from nanoserve import LLM, SamplingParams
    from nanoserve.bench.shapes import shape_checkpoint

    d = shape_checkpoint("smollm2-135m")
    g = torch.Generator().manual_seed(52)
    prompts = [torch.randint(2, 49000, (16,), generator=g).tolist() for _ in range(requests)]
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    ids = itertools.count()

    def arm(dtype: str):
        llm = LLM(d, dtype=dtype, skip_tokenizer_init=True, max_num_seqs=requests,
                  max_model_len=64)

        def once() -> float:
            for p in prompts:
                llm.core.add(llm.core.make_request(f"r{next(ids)}", p, params))
            llm.core.step()  # the prefill of all of them
            t = time.perf_counter()
            while llm.core.has_unfinished():
                llm.core.step()
            return time.perf_counter() - t
        return once

    best = best_of(rounds, {"bf16": arm("bfloat16"), "fp32": arm("float32")}, lambda s: s)
    return best["fp32"] / best["bf16"]


def bf16_chosen_here() -> str | None:
    """The timed row's condition: on one thread, ``dtype="auto"`` picks bf16 for this shape."""
    from nanoserve.bench.shapes import SHAPES
    from nanoserve.cpu import auto_dtype

    shape = SHAPES["smollm2-135m"]
    with one_thread():
        dtype, why = auto_dtype.choose(shape["hidden_size"], shape["intermediate_size"])
    return None if dtype == torch.bfloat16 else f"dtype=auto picks float32 here ({why})"


TINY = "nanoserve-tiny, 64 tokens of text"
CLAIMS = [
    exact("the frozen rule's `resolve_dtype(\"auto\")` on a CPU whose flags are "
          "{avx512f, avx512_bf16}; {amx_bf16, amx_tile}; {avx2, avx512f}", examples),
    exact("the frozen rule vs the package: every subset of five flags x device (cpu, cuda) x "
          "the checkpoint's dtype x the dtype asked, but for auto on a CPU", agreement),
    exact("the package's `dtype=\"auto\"` on two CPUs flagged {avx512f, avx512_bf16} whose "
          "load-time measurement gives bf16 2x and 0.83x float32's speed", same_flags),
    exact("the log line of `LLM(dtype=\"auto\")` on those two", log_lines),
    exact("`LLM(dtype=\"auto\")` on the CPU running the claims, against the verdict cached "
          "for it in build/dtype_auto.json", this_machine),
    exact("nanoserve-tiny in bf16: weights, KV cache, logits handed to the sampler",
          float32_stays),
    bound(f"{TINY}: ours in bf16 vs transformers in fp32, max relative logit error",
          lambda: errors()["ours16"], fmt="{:.4f}".format),
    bound(f"{TINY}: transformers in bf16 vs transformers in fp32, max relative logit error",
          lambda: errors()["theirs16"], fmt="{:.4f}".format),
    bound(f"{TINY}: the two bf16 errors, ours / transformers'",
          lambda: errors()["ours16"] / errors()["theirs16"], fmt="{:.2f}x".format),
    bound(f"{TINY}: ours in fp32 vs transformers in fp32, max relative logit error",
          lambda: errors()["ours32"], fmt="{:.1e}".format),
    bound(f"{TINY}: positions whose argmax in bf16 (ours) matches transformers' fp32",
          lambda: errors()["argmax"], fmt="{:.1%}".format),
    exact("`LLM(...)` calls in tests/test_parity.py that pin dtype=\"float32\"", pinned),
    timed("2-core x86 CPU on which `dtype=\"auto\"` (one thread) measures bf16 faster for "
          "this shape, no GPU, one thread; SmolLM2-135M shape (random weights), 64 running "
          "requests, 16-token prompts: decode throughput, bf16 / fp32 (8 steps, best of 3 "
          "interleaved rounds)", decode_speedup, fmt="{:.2f}x".format, needs=bf16_chosen_here),
]

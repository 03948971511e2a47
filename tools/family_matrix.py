"""Every model family on every attention backend, held against transformers: one table.

Why this file exists: issue 39 asks that each family (Llama, Qwen2, Qwen3, Mistral, Phi-3,
Gemma 3 and the language model of a multimodal Gemma 3) be held against transformers on *every*
attention backend, with chunked prefill, prefix caching, preemption and ``-tp 2``, and that the
closing note carry the table. The per-family tests each hold some of those paths; this script
runs the whole product and prints it as one markdown table, the machine and the command under
it. ``tests/test_family_matrix.py`` imports these functions and asserts the same cells (the
``slow`` tier), so the table and the tests cannot drift apart.

Each family's representative is a small random checkpoint written by transformers' own class
(``nanoserve.testing.write_hf_checkpoint``), windowed where the family has windows, every
window shorter than three of the four prompts and no shorter than the fourth. In float32:

- *max logit diff*: every prefill and decode logit of ``STEPS`` greedy steps through the
  engine's own prefill and decode (``testing.greedy_logits``), against transformers' ``generate``;
- *greedy*: the four prompts at once, whole, tokens identical to transformers';
- *chunked+prefix+preemption*: the same prompts (three share a 9-token prefix) with a budget of
  8 tokens a step, prefix caching and a pool of blocks of 4 that fits the longest request alone
  (``cramped_blocks``): tokens identical, at least one preemption, every block back after the
  drain;
- *-tp 2* (``--tp``): two ranks over gloo, logits within the bound and tokens identical.

The ``cpu`` backend runs with the C++ ops on (``kernels=True``, a family's fused forward where
it has one); the others with ``kernels=False``. ``triton`` runs in Triton's interpreter.

    python tools/family_matrix.py --tp
    python tools/family_matrix.py --families mistral gemma3 --backends reference triton
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

BOUND = 1e-5  # float32 logits against transformers
STEPS = 8
BLOCK_SIZE = 4
SHARED = [9, 150, 4, 77, 11, 22, 33, 44, 1]  # two whole blocks of 4 and one token
PROMPTS = [[*SHARED, 2, 3], [5, 17, 3], [*SHARED, 5, 6, 7, 8], [*SHARED, 250]]
# chunked prefill (a budget of 8 tokens, under the 10- to 13-token prompts), prefix caching, and
# a pool just large enough for the longest request alone (``cramped_blocks``): the four at once
# preempt. An all-windowed family holds few blocks a request (those behind its window go back),
# so the budget lets enough rows run at once to preempt it too (measured: Phi-3's window of 5
# preempts once, Mistral's twice, the others four times).
CRAMPED = dict(block_size=BLOCK_SIZE, max_num_batched_tokens=8, max_num_seqs=4,
               enable_prefix_caching=True)
BACKENDS = ("reference", "gathered", "cpu", "triton")

_QWEN3_TYPES = ["sliding_attention", "full_attention"]
# family -> (testing.write_hf_checkpoint shape name, overrides, what the checkpoint exercises)
CASES: dict[str, tuple[str, dict, str]] = {
    "llama": ("gqa", {}, "GQA (8 query heads over 2), no window"),
    "qwen2": ("gqa", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
              "q/k/v biases; layer 1 windowed (4) by max_window_layers"),
    "qwen3": ("head_dim", {"use_sliding_window": True, "sliding_window": 3,
                           "layer_types": _QWEN3_TYPES},
              "q/k norms, head_dim 32 over hidden/heads 16; layer 0 windowed (3) by layer_types"),
    "mistral": ("gqa", {"sliding_window": 4}, "every layer windowed (4): blocks freed"),
    "phi3": ("phi3-partial", {"sliding_window": 5},
             "fused qkv and gate_up, partial rotary 0.75, window 5"),
    "gemma3": ("gemma3", {}, "local (4) and global layers, two RoPE bases, head_dim 32 over 16, "
                             "query_pre_attn_scalar, soft-capped logits"),
    "gemma3-vision": ("gemma3", {"final_logit_softcapping": None},
                      "Gemma3ForConditionalGeneration: its language model"),
}


def why_not(backend: str) -> str | None:
    """Why attention backend ``backend`` cannot run on this machine, or None."""
    if backend == "cpu":
        from nanoserve.cpu import csrc

        problem = csrc.load()
        return None if problem is None else f"the C++ ops: {problem}"
    if backend == "triton":
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") == "0":
            return "no CUDA and TRITON_INTERPRET=0 (the interpreter is off)"
    return None


def runnable_backends(wanted=BACKENDS) -> list[str]:
    return [b for b in wanted if why_not(b) is None]


def engine_options(backend: str) -> dict:
    """The options one cell's engines share: float32, this backend, the C++ ops for ``cpu``."""
    return dict(dtype="float32", skip_tokenizer_init=True, attention=backend,
                kernels=backend == "cpu", max_model_len=64)


def write_checkpoint(family: str, root: str | Path) -> Path:
    """``family``'s representative checkpoint, written by transformers under ``root``."""
    from nanoserve.testing import write_hf_checkpoint

    name, overrides, _ = CASES[family]
    return write_hf_checkpoint(Path(root) / family, name, family=family, **overrides)


def transformers_greedy(path, prompts=PROMPTS, steps: int = STEPS):
    """Per prompt: transformers' greedy tokens and the (V,) float32 logits that chose them."""
    from nanoserve.testing import hf_greedy

    return hf_greedy(path, prompts, steps)


def logit_diff(llm, expected, prompts=PROMPTS) -> tuple[float, bool]:
    """The largest |logit - transformers'| over every prompt's prefill and decodes, and whether
    each step's argmax is transformers' token."""
    from nanoserve.testing import greedy_logits

    worst, same = 0.0, True
    for p, (tokens, logits) in zip(prompts, expected, strict=True):
        ours = greedy_logits(llm, p, len(tokens))
        worst = max(worst, *((a - b).abs().max().item() for a, b in zip(ours, logits,
                                                                          strict=True)))
        same &= [int(x.argmax()) for x in ours] == tokens
    return worst, same


def greedy_tokens(llm, prompts=PROMPTS, steps: int = STEPS) -> list[list[int]]:
    from nanoserve import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=steps,
                                                ignore_eos=True))
    return [o.token_ids for o in outs]


def cramped_blocks(llm, prompts=PROMPTS, steps: int = STEPS) -> int:
    """The smallest pool of ``BLOCK_SIZE``-token blocks the door check lets the longest request
    into alone, plus the null block a windowed pool keeps (``llm``: an engine of the model)."""
    longest = max(len(p) for p in prompts) + steps
    return -(-longest // BLOCK_SIZE) + llm.core.scheduler.kv_cache_manager.reserved


def drained(llm) -> str | None:
    """None when every KV block is back in the pool and every slot free; else what is not."""
    try:
        llm.core.check_drained()
    except AssertionError as e:
        return str(e) or "not drained"
    return None


@dataclass
class Cell:
    """One family on one backend: what each column measured."""

    family: str
    backend: str
    logit_diff: float = float("nan")
    greedy: bool = False  # whole prompts, batched, tokens == transformers'
    cramped: bool = False  # chunked + prefix caching + preemption, tokens == transformers'
    preemptions: int = 0
    prefix_hits: int = 0
    leak: str | None = "not run"  # None: every block back after each drain
    tp_diff: float | None = None  # None: -tp 2 not run
    tp_greedy: bool = False
    error: str | None = None  # what the one-process part raised
    tp_error: str | None = None  # what the -tp 2 part raised
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        tp = self.tp_error is None and (self.tp_diff is None or (self.tp_diff <= BOUND
                                                                  and self.tp_greedy))
        return (self.error is None and self.logit_diff <= BOUND and self.greedy
                and self.cramped and self.preemptions > 0 and self.leak is None and tp)


def single_columns(path, backend: str, expected, cell: Cell) -> None:
    """Fill ``cell``'s one-process columns: logits, greedy, chunked + prefix + preemption."""
    from nanoserve import LLM

    want, opts = [t for t, _ in expected], engine_options(backend)
    llm = LLM(str(path), **opts)
    cell.logit_diff, same = logit_diff(llm, expected)
    cell.greedy = same and greedy_tokens(llm) == want
    leaks = [drained(llm)]
    llm = LLM(str(path), **opts, **CRAMPED, num_kv_blocks=cramped_blocks(llm))
    cell.cramped = greedy_tokens(llm) == want
    cell.preemptions, cell.prefix_hits = llm.stats.preemptions, llm.stats.prefix_cache_hits
    leaks.append(drained(llm))
    cell.leak = next((lk for lk in leaks if lk is not None), None)


def tp_columns(path, backend: str, expected, cell: Cell) -> None:
    """Fill ``cell``'s ``-tp 2`` columns: two ranks (a spawned worker, gloo), logits and
    tokens; a leak after the drain is the cell's leak."""
    from nanoserve import LLM

    with LLM(str(path), **engine_options(backend), tensor_parallel_size=2) as llm:
        cell.tp_diff, same = logit_diff(llm, expected)
        cell.tp_greedy = same and greedy_tokens(llm) == [t for t, _ in expected]
        cell.leak = cell.leak or drained(llm)


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:160]


def run_cell(path, family: str, backend: str, expected, tp: bool = False) -> Cell:
    """Every column of one (family, backend) cell; ``expected`` is ``transformers_greedy``'s.
    A part that raises says why in its columns, and the table goes on."""
    cell, start = Cell(family, backend), time.perf_counter()
    try:
        single_columns(path, backend, expected, cell)
    except Exception as e:
        cell.error = _why(e)
    if tp:
        try:
            tp_columns(path, backend, expected, cell)
        except Exception as e:
            cell.tp_error = _why(e)
    cell.seconds = time.perf_counter() - start
    return cell


def _yes(ok: bool) -> str:
    return "identical" if ok else "**DIFFERS**"


def table(cells: list[Cell], tp: bool) -> str:
    """The markdown table: one row a cell."""
    head = ["family", "backend", "max logit diff", "greedy", "chunked+prefix+preemption"]
    head += ["-tp 2"] if tp else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        if c.error is not None:
            row = [c.family, c.backend, f"**error**: {c.error}", "", ""]
        else:
            cramped = (f"{_yes(c.cramped)} ({c.preemptions} preemption"
                       f"{'' if c.preemptions == 1 else 's'}, {c.prefix_hits} prefix hits, "
                       f"{'pool full after drain' if c.leak is None else c.leak})")
            row = [c.family, c.backend, f"{c.logit_diff:.1e}", _yes(c.greedy), cramped]
        if tp:
            row.append(f"**error**: {c.tp_error}" if c.tp_error is not None else
                       "not run" if c.tp_diff is None else
                       f"{_yes(c.tp_greedy)} (max logit diff {c.tp_diff:.1e})")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", action="store_true", help="add the -tp 2 column (gloo)")
    parser.add_argument("--families", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    from nanoserve.cuda.triton_mode import use_interpreter

    use_interpreter()  # before anything imports triton (no-op with CUDA or a caller's choice)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    from nanoserve.bench.hardware import describe_hardware

    start = time.perf_counter()
    backends = runnable_backends(args.backends)
    skipped = {b: why_not(b) for b in args.backends if b not in backends}
    cells = []
    with tempfile.TemporaryDirectory(prefix="family-matrix-") as root:
        for family in args.families:
            path = write_checkpoint(family, root)
            expected = transformers_greedy(path)
            for backend in backends:
                cells.append(cell := run_cell(path, family, backend, expected, tp=args.tp))
                print(f"{family:>14} {backend:>9}: {'ok' if cell.ok else 'FAILED'} "
                      f"({cell.seconds:.1f} s)", file=sys.stderr, flush=True)
    print(table(cells, args.tp))
    print()
    for family in args.families:
        name, overrides, what = CASES[family]
        print(f"- {family}: `{name}` {overrides or ''}: {what}")
    for b, why in skipped.items():
        print(f"- backend {b} not run: {why}")
    print(f"\nfloat32, bound {BOUND:g}; {len(PROMPTS)} prompts of {sorted(map(len, PROMPTS))} "
          f"tokens, {STEPS} greedy steps; cramped: {CRAMPED}")
    print(f"machine: {describe_hardware()}")
    print(f"command: {shlex.join(['python', 'tools/family_matrix.py', *argv])}")
    print(f"wall time: {time.perf_counter() - start:.0f} s")
    failed = [f"{c.family}/{c.backend}" for c in cells if not c.ok]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Day 56's numbers: which entry point takes which speed option, how an unset
``--persistent-batch`` resolves, and greedy tokens across every combination of the switches.

The flag rows parse real command lines with ``nanoserve serve``'s parser
(``nanoserve.entrypoints.openai.serve.add_arguments``, whose engine flags are
``EngineConfig.add_cli_args``) and hold what ``EngineConfig.from_cli_args`` resolves (the row
still named for Day 56's ``speed_options``) against the frozen rule; the token rows run
nanoserve-tiny in float32 on one thread (8 requests, 4 slots, generation lengths 4/8/16/32, EOS
ignored).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import itertools

from chapters.common import SHIPPED, one_thread
from chapters.runner import exact

from .snapshot import flags as snap

SPEED_DESTS = ("compile", "attention", "cuda_graphs", "compact_rows")  # --persistent-batch's
PERSISTENT = {None: (), True: ("--persistent-batch",), False: ("--no-persistent-batch",)}
PROMPTS = [[0, 5 + i, 9, 11] for i in range(8)]
GEN = (4, 8, 16, 32)


def parser() -> argparse.ArgumentParser:
    from nanoserve.entrypoints.openai.serve import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def serve_flags() -> str:
    by_dest: dict[str, list[str]] = {}
    for a in parser()._actions:
        if a.dest in SPEED_DESTS:
            by_dest.setdefault(a.dest, []).extend(a.option_strings)
    return ", ".join("/".join(by_dest[d]) for d in SPEED_DESTS)


def speed_params(fn) -> str:
    names = [n for n in inspect.signature(fn).parameters if n in snap.SPEED_KEYWORDS]
    return ", ".join(names)


def keywords() -> str:
    """What each layer takes: ``EngineConfig`` its fields (the flags become them, and ``LLM``
    and ``AsyncLLM.from_options`` take exactly those names), the engine and the scheduler (which
    the core builds from the config) their constructors' keywords."""
    from nanoserve.config import EngineConfig
    from nanoserve.engine.engine import Engine
    from nanoserve.engine.scheduler import Scheduler

    fields = ", ".join(n for n in EngineConfig.names() if n in snap.SPEED_KEYWORDS)
    return "; ".join([f"EngineConfig: {fields}", f"LLM: {fields}",
                      *(f"{name}: {speed_params(fn)}" for name, fn in
                        (("Engine", Engine), ("Scheduler", Scheduler)))])


def defaults() -> str:
    a = parser().parse_args([])
    return ", ".join(f"{d}={getattr(a, d)}" for d in SPEED_DESTS)


def resolved(argv: tuple[str, ...]) -> dict:
    """The four keywords a command line asks for: the config ``EngineConfig.from_cli_args``
    builds, with ``persistent_batch`` (where an unset ``--persistent-batch`` is resolved)."""
    from nanoserve.config import EngineConfig

    cfg = EngineConfig.from_cli_args(parser().parse_args(list(argv)))
    return {"compile": cfg.compile, "attention": cfg.attention, "cuda_graphs": cfg.cuda_graphs,
            "compact_rows": cfg.persistent_batch}


def unset() -> str:
    off, on = resolved(())["compact_rows"], resolved(("--cuda-graphs",))["compact_rows"]
    return f"{'on' if off else 'off'} without --cuda-graphs, {'on' if on else 'off'} with it"


def tri_state() -> str:
    cells = []
    for graphs in (False, True):
        got = [resolved(("--cuda-graphs",) * graphs + PERSISTENT[pb])["compact_rows"]
               for pb in (None, True, False)]
        cells.append(("graphs" if graphs else "no graphs") + ": "
                     + ", ".join("on" if c else "off" for c in got))
    return "; ".join(cells)


def frozen_rule() -> str:
    """Every command line over the four switches, package against the frozen rule."""
    p = argparse.ArgumentParser()
    snap.add_speed_arguments(p)
    agree = total = 0
    for comp, att, graphs, pb in itertools.product(
            (("--compile",), ("--no-compile",), ()), snap.ATTENTION_PATHS, (False, True),
            (None, True, False)):
        argv = (*comp, "--attention", att, *("--cuda-graphs",) * graphs, *PERSISTENT[pb])
        total += 1
        agree += resolved(argv) == snap.speed_options(p.parse_args(list(argv)))
    return f"{agree} of {total} agree"


def llm_follows() -> str:
    from nanoserve import LLM

    got = [LLM(SHIPPED, dtype="float32", max_model_len=64, skip_tokenizer_init=True,
               cuda_graphs=g).compact_rows for g in (False, True)]
    return ", ".join(map(str, got))


def build_engine_unbundled() -> str:
    from nanoserve.config import EngineConfig
    from nanoserve.entrypoints.openai.serve import build_engine

    core = build_engine(EngineConfig(SHIPPED, cuda_graphs=True, compact_rows=False,
                                     dtype="float32", max_model_len=64,
                                     skip_tokenizer_init=True)).core
    windows = "windows on" if core.engine.graphs is not None else "windows off"
    return f"{windows}, compactor mode {core.scheduler.compactor.mode!r}"


@functools.cache
def matrix() -> tuple[dict, ...]:
    """Every combination of compile (off, or dynamo with its "eager" backend), attention
    (reference, gathered), cuda_graphs and compact_rows: greedy tokens and counters. Day 58's
    claims read the replay shares and compile counts of the same runs."""
    import torch

    from nanoserve import LLM, SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=GEN[i % len(GEN)], ignore_eos=True)
              for i in range(len(PROMPTS))]
    runs = []
    with one_thread():
        for comp, att, graphs, compact in itertools.product(
                (False, "eager"), ("reference", "gathered"), (False, True), (False, True)):
            if comp:
                torch._dynamo.reset()  # each engine compiles its own buckets from scratch
            llm = LLM(SHIPPED, dtype="float32", max_num_seqs=4, max_model_len=64,
                      skip_tokenizer_init=True, compile=comp, attention=att,
                      cuda_graphs=graphs, compact_rows=compact, enable_chunked_prefill=False)
            tokens = [o.token_ids for o in llm.generate(PROMPTS, params)]
            runs.append({"compile": comp, "attention": att, "graphs": graphs,
                         "compact": compact, "tokens": tokens, "share": llm.stats.replay_share,
                         "compiles": llm.engine.compiled.compiles if comp else None,
                         "windows": llm.engine.graphs})
    return tuple(runs)


def mismatches() -> str:
    runs = matrix()
    plain = runs[0]["tokens"]  # compile off, reference read, no windows, free rows
    bad = sum(r["tokens"][i] != plain[i] for r in runs for i in range(len(plain)))
    return f"{len(runs)} combinations, {bad} mismatched requests"


def on_cpu() -> str:
    from nanoserve import LLM

    try:
        g = LLM(SHIPPED, dtype="float32", max_model_len=64, skip_tokenizer_init=True,
                cuda_graphs=True).engine.graphs
    except Exception as e:  # noqa: BLE001 - the claim is that nothing is raised
        return f"raises {type(e).__name__}"
    return f"nothing; {g.mode} over buckets {g.sizes}"


CLAIMS = [
    exact("`nanoserve serve`: the speed flags", serve_flags),
    exact("the speed keywords each layer takes", keywords),
    exact("the flags' defaults (argparse dests)", defaults),
    exact("an unset `--persistent-batch`", unset),
    exact("`compact_rows` for each `--persistent-batch` state (unset, on, off)", tri_state),
    exact("every command line over the four switches: `speed_options` against the frozen rule",
          frozen_rule),
    exact("`LLM(compact_rows=None)`, with `cuda_graphs` False, True", llm_follows),
    exact("`build_engine(cuda_graphs=True, compact_rows=False)` builds", build_engine_unbundled),
    exact("greedy tokens, every combination against the plain engine", mismatches),
    exact("`LLM(cuda_graphs=True)` on a CPU raises", on_cpu),
]

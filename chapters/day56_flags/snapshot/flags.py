"""Day 56 snapshot (frozen): the speed switches as a command line sees them, and how they resolve.

Each speed option is a switch of its own, so that a benchmark can hold every other one still
while it moves one. Only the command line ties two together: a persistent batch left unset
follows the graphs, because graphs over a batch whose rows are not packed replay only some of
its steps. Everything below the command line takes the resolved value and decides nothing.

    >>> resolve(cuda_graphs=False, persistent_batch=None), resolve(True, None)
    (False, True)
    >>> resolve(True, False), resolve(False, True)
    (False, True)
    >>> p = argparse.ArgumentParser(); add_speed_arguments(p)
    >>> speed_options(p.parse_args(["--cuda-graphs"]))["compact_rows"]
    True
"""

from __future__ import annotations

import argparse

ATTENTION_PATHS = ("reference", "gathered", "triton")
SPEED_KEYWORDS = ("compile", "attention", "cuda_graphs", "compact_rows")


def resolve(cuda_graphs: bool, persistent_batch: bool | None) -> bool:
    """Whether running rows are compacted: as asked, or, when nobody asked, like the graphs."""
    return bool(cuda_graphs) if persistent_batch is None else bool(persistent_batch)


def add_speed_arguments(p: argparse.ArgumentParser) -> None:
    """The four switches. ``--persistent-batch`` is tri-state: two flags share one dest whose
    default is None, which means "not said"."""
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--attention", choices=ATTENTION_PATHS, default="gathered")
    p.add_argument("--cuda-graphs", action="store_true")
    p.add_argument("--persistent-batch", dest="persistent_batch", action="store_true",
                   default=None)
    p.add_argument("--no-persistent-batch", dest="persistent_batch", action="store_false")


def speed_options(args: argparse.Namespace) -> dict:
    """The engine's four keywords from the parsed flags: the one place any bundling happens."""
    return {"compile": args.compile, "attention": args.attention,
            "cuda_graphs": args.cuda_graphs,
            "compact_rows": resolve(args.cuda_graphs, args.persistent_batch)}

"""The syntax of ``threads_bind``: ``auto``, ``nobind``, or a list of CPUs such as ``0-3,8``.

Why this module exists: the option is checked when an ``EngineConfig`` is made, long before any
thread is pinned, and a config must not load the C++ ops to check a string. What the words mean
on a machine is ``nanoserve.cpu.threads.plan``'s business.

>>> parse_cpus("0-3,8")
[0, 1, 2, 3, 8]
>>> check_spec("3-1")
Traceback (most recent call last):
ValueError: threads_bind='3-1': the range '3-1' runs backwards
"""

from __future__ import annotations

BIND_WORDS = ("auto", "nobind")


def parse_cpus(spec: str) -> list[int]:
    """``"0-3,8"`` -> [0, 1, 2, 3, 8]; a ValueError names what is wrong."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"threads_bind={spec!r}: {part!r} is not a CPU or a range a-b")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"threads_bind={spec!r}: the range {part!r} runs backwards")
        out.extend(range(first, last + 1))
    if len(set(out)) != len(out):
        raise ValueError(f"threads_bind={spec!r} names a CPU twice")
    return out


def check_spec(spec: str) -> None:
    if spec not in BIND_WORDS:
        parse_cpus(spec)

"""Day 35 snapshot (frozen): how the stress test judges a run.

A request that finished normally must have exactly the roomy engine's tokens; an aborted one must
have a prefix of them (it stopped early, it must not have said anything different). Pure standard
library.
"""

from __future__ import annotations


def mismatches(outputs: list[list[int]], aborted: list[bool],
               reference: list[list[int]]) -> list[int]:
    bad = []
    for i, (out, was_aborted, ref) in enumerate(zip(outputs, aborted, reference, strict=True)):
        expected = ref[:len(out)] if was_aborted else ref
        if out != expected:
            bad.append(i)
    return bad

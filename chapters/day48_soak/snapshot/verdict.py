"""Day 48 snapshot (frozen): the rule that judges a soak.

A soak passes when nothing failed, every greedy text that completed equals the offline engine's,
nothing is still running or waiting a few seconds after the last response, the KV-cache usage
is exactly zero at the end (every block back), and the server's resident memory at the end is
within 10% of its reading early in the run. ``problems(record)`` lists what did not hold, in
that order; an empty list is a pass. The record is the dict ``nanoserve bench soak`` writes.

    >>> problems({"failed": 0, "mismatches": 0, "stuck_requests": 0, "settled_within_s": 0.1,
    ...           "leaked_blocks_frac": 0.0, "rss_growth": 0.02})
    []
    >>> for p in problems({"failed": 2, "mismatches": 0, "stuck_requests": 0,
    ...                    "settled_within_s": 0.1, "leaked_blocks_frac": 0.25,
    ...                    "rss_growth": -0.2}):
    ...     print(p)
    2 requests failed
    KV usage 0.25 at the end: blocks leaked
    RSS grew -20.0% after the first 1,000 requests
"""

from __future__ import annotations

RSS_LIMIT = 0.10  # the end within 10% of the early reading, either way


def problems(s: dict) -> list[str]:
    bad = []
    if s["failed"]:
        bad.append(f"{s['failed']} requests failed")
    if s["mismatches"]:
        bad.append(f"{s['mismatches']} greedy texts differ from the offline engine's")
    if s["stuck_requests"] or s["settled_within_s"] is None:
        bad.append("requests still running or waiting 5 s after the last response")
    if s["leaked_blocks_frac"] != 0:
        bad.append(f"KV usage {s['leaked_blocks_frac']} at the end: blocks leaked")
    if abs(s["rss_growth"]) > RSS_LIMIT:
        bad.append(f"RSS grew {s['rss_growth']:.1%} after the first 1,000 requests")
    return bad

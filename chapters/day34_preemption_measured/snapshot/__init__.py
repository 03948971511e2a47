"""Day 34 as it stood: the preemption report, computed from per-request records."""

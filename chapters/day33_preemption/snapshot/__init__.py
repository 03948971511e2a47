"""Day 33 as it stood: incremental allocation, preemption by recompute, the harness."""

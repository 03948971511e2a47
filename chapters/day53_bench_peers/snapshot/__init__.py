"""Day 53 as it stood: the seeded ragged workload every engine in the bench runs, and what
static waves of it cost."""

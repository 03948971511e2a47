"""Day 66 as it stood: what tensor parallelism moves per step, and what it buys here."""

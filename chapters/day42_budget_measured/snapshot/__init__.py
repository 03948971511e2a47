"""Day 42 as it stood: the long_among_short workload generator, in plain Python."""

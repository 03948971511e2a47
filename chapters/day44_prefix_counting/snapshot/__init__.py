"""Day 44 as it stood: the prefix cache's counters predicted before they are read."""

"""Day 67's frozen pieces: the bitmask's layout and the two spec rewrites, in plain torch."""

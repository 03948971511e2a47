"""Day 7 as it stood: the contiguous KV cache and the cached generation loop."""

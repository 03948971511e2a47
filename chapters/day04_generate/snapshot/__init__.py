"""Day 4 as it stood: the generation loop, with no cache."""

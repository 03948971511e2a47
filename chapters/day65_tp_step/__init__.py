"""Day 65 as it stood: rank 0 hands each forward to the workers in one message."""

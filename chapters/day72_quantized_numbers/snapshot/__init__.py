"""Day 72's frozen piece: one group of weights on a signed integer grid, and the nibbles that
store it."""

"""Day 70's frozen piece: which blocks of a request a sliding window lets go, in plain Python."""

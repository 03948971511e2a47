"""Day 77's frozen piece: the rejection sampler's rule in plain PyTorch (greedy verification,
and the accept-or-draw-from-the-residual rule that leaves the target's distribution unchanged)."""

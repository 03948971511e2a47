"""Day 32's frozen piece: a decode step's bill counted from a model's tensors, not its config."""

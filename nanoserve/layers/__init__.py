"""Layers: the pieces a model family is built from (norms, rotary embeddings, linear layers).

Why this package exists: families differ in how they arrange these pieces, not in the pieces
themselves, so a new family is a new arrangement, not a copy. A linear layer holds a *linear
method* chosen once at load (``linear.py``): the seam where packed and quantized weights plug in.

May import: ``nanoserve.config``, ``nanoserve.cpu`` (the kernels a linear method runs).
"""

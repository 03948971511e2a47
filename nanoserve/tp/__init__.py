"""Tensor parallelism (Days 64-66): one model split over ranks, one process each.

Why this package exists: the split (``shard.py``), the places the ranks meet (``layers.py``,
``comm.py``), the slice-by-slice load (``load.py``), and the step's hand-off from rank 0 to the
workers (``protocol.py``, ``mirror.py``, ``executor.py``, ``worker.py``) are one idea spread over
a few concepts; each is its own module, and nothing outside this package knows there are ranks
beyond ``loader.load_engine``, which starts them, and ``Engine.close``, which stops them.

May import: ``nanoserve.engine`` (rank 0's engine is an ``Engine``) and what lies below it.
"""

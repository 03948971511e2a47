"""The engine core and scheduling: requests, the scheduler, its KV cache manager, and the
``Engine`` that runs one scheduled step through the model.

Why this package exists: a request's whole life is decided here (admitted, grown, preempted,
compacted, finished) and computed here, one iteration at a time; nothing here knows HTTP exists,
and nothing above it touches a block or a row.

May import: ``nanoserve.model``, ``nanoserve.attention``, ``nanoserve.sampling``,
``nanoserve.structured``, ``nanoserve.cpu``, ``nanoserve.cuda``, ``nanoserve.config`` and the
root's leaf modules (``tokenizer``, ``validation``).
"""

"""Attention: the paged KV cache (pools, block and slot tables, a step's layout) and one backend
per read path, chosen once at load.

May import: ``nanoserve.cpu`` (the C++ kernel), ``nanoserve.cuda`` (the Triton kernel),
``nanoserve.config``.
"""

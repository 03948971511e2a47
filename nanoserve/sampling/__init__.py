"""Sampling: ``SamplingParams`` (``params.py``) and the sampler that applies them (``sampler.py``).

May import: ``nanoserve.structured`` (grammar masks), ``nanoserve.cpu`` (the argmax op),
``nanoserve.validation``.
"""

"""The model: a registry from a checkpoint's ``architectures`` to a family, one module per
family, and the weights' loading from Hugging Face safetensors.

May import: ``nanoserve.layers``, ``nanoserve.attention``, ``nanoserve.cpu``,
``nanoserve.quantization``, ``nanoserve.config``.
"""

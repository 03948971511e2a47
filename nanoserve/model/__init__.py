"""The model: a registry from a checkpoint's ``architectures`` to a family, one module per
family, the weights' loading from Hugging Face safetensors, and the shipped model's text and a
model's loss over it (``text_loss.py``).

May import: ``nanoserve.layers``, ``nanoserve.attention``, ``nanoserve.cpu``,
``nanoserve.quantization``, ``nanoserve.config``.
"""

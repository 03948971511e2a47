"""``nanoserve quantize``: a model in, a compressed-tensors checkpoint out, and its quality.

Why this package exists: a quantized checkpoint has to come from somewhere, and the ecosystem's
tool for it (llmcompressor) is a GPU-sized install. This package makes the same files from a
checkpoint folder: the scheme and method (``recipe.py``), calibration block by block with the
Hessians GPTQ needs (``calibrate.py``), the folder compressed-tensors and transformers read
(``write.py``), perplexity and per-layer error (``quality.py``), and the command
(``command.py``). The arithmetic (RTN, GPTQ, packing) lives in ``nanoserve.quantization``.

May import: ``nanoserve.model``, ``nanoserve.layers``, ``nanoserve.quantization``,
``nanoserve.tokenizer``, ``nanoserve.config``.
"""

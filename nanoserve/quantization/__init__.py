"""Quantized weights: what a quantized number is, and how the ecosystem's checkpoints store them.

Why this package exists: a decode step on a CPU reads every weight once, so its speed is memory
bandwidth over the weights' bytes, and int8 or int4 weights read in a half or a quarter of
bfloat16's bytes. Each published format (compressed-tensors, GPTQ, AWQ) packs the same three
things differently: small integers, a scale per group of inputs, and sometimes a zero point. This
package reads each of them into one canonical form, ``QuantizedWeight`` (``weight.py``), that
the linear methods (``nanoserve.layers.linear_quant``) and the C++ kernels take, and holds the
arithmetic every format shares: round-to-nearest (``rtn.py``), the int32 packing
(``packing.py``), and the GPTQ solver.

May import: ``nanoserve.config``.
"""

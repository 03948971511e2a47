"""Structured outputs (Days 67-68): a request's JSON schema, regex, choice or grammar turned into
a mask over the vocabulary at every step, so the text it gets back is in the language it asked
for.

Why this package exists: the grammar machinery is a library's (llguidance), and what nanoserve
adds is the seam: the request's spec and its checks (``params.py``), one compiled grammar per
distinct spec and one tokenizer view per engine (``backend.py``), and the batch's bitmask
applied to the constrained rows' logits before sampling (``mask.py``).

llguidance rather than xgrammar: it is one abi3 wheel with no Python dependencies, builds its
view of the vocabulary from the checkpoint's own ``tokenizer.json`` (byte-fallback and special
tokens included) without transformers, and compiles JSON schemas, regexes and Lark or GBNF
grammars lazily, so a grammar costs little before its first mask. xgrammar would bring
transformers, triton and a second FFI runtime into the serving install.

May import: ``nanoserve.cpu`` (the bitmask op), ``nanoserve.validation``.
"""

"""Test helpers (the ``test`` extra): reference checkpoints written by transformers, and the
chat formats of their tokenizers.

Why this package exists: no model hub is reachable here, so correctness is checked on small random
checkpoints that transformers itself writes (``checkpoints.py``), with character-level tokenizers
that carry each family's published chat format, tools included (``chat_formats.py``). Every name
the two modules define is re-exported here, so ``from nanoserve.testing import X`` reads the same
as it did when this was one module. The engine itself never imports this package.

May import: ``torch`` and, inside functions, ``transformers`` and ``tokenizers``; nothing of
nanoserve.
"""

from nanoserve.testing.chat_formats import CHAT_TEMPLATES, SPECIAL_TOKENS, write_tokenizer
from nanoserve.testing.checkpoints import (
    BASE,
    CONFIGS,
    FAMILIES,
    FAMILY_BASE,
    SCHEMA_WORDS,
    TINY_VISION,
    VARIANTS,
    greedy_logits,
    hf_greedy,
    load_hf_model,
    longrope_factors,
    random_json_schema,
    relative_logit_error,
    write_hf_checkpoint,
)

__all__ = ["BASE", "CHAT_TEMPLATES", "CONFIGS", "FAMILIES", "FAMILY_BASE", "SCHEMA_WORDS",
           "SPECIAL_TOKENS", "TINY_VISION", "VARIANTS", "greedy_logits", "hf_greedy",
           "load_hf_model", "longrope_factors", "random_json_schema", "relative_logit_error",
           "write_hf_checkpoint", "write_tokenizer"]

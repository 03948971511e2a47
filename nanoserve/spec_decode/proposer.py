"""What a proposer is, and the registry from ``speculative_config``'s method to its class.

Why this module exists: the engine core asks one question after every step, "what should each
decoding request try next?", and does not care who answers. A proposer answers it by setting
each request's ``spec_token_ids`` (at most ``k`` tokens to follow its output) and
``spec_draft_probs`` (the draft's distributions for them, ``(k, V)``, or None when a proposal is
certain, as an n-gram's is). A new proposer is one entry in ``PROPOSERS`` and its own file.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanoserve.config.speculative import SpeculativeConfig
    from nanoserve.engine.request import Request

PROPOSERS = {  # speculative_config's "method" -> the class that proposes for it
    "ngram": "nanoserve.spec_decode.ngram.NgramProposer",
    "draft_model": "nanoserve.spec_decode.draft.DraftModelProposer",
}


class Proposer:
    """Base class: ``propose(requests)`` fills each request's ``spec_token_ids``."""

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self.k = config.num_speculative_tokens

    @classmethod
    def create(cls, config: SpeculativeConfig, loaded) -> Proposer:
        """The proposer for an engine that ``nanoserve.loader`` loaded (``loaded``: its
        ``LoadedEngine``: model, tokenizer, dtype, device, ``max_model_len``)."""
        return cls(config)

    def describe(self) -> str:
        """One line for the log: what proposes, and how many tokens."""
        return f"{self.config.method}, {self.k} tokens a step"

    def propose(self, requests: list[Request]) -> None:
        """Set ``spec_token_ids`` (and ``spec_draft_probs``) on each of ``requests``: running,
        decoding, their newest token sampled and not yet computed."""
        raise NotImplementedError

    def release(self, request: Request) -> None:
        """``request`` left the running batch (finished, aborted, preempted): forget it."""


def proposer_class(method: str) -> type[Proposer]:
    if method not in PROPOSERS:
        raise ValueError(f"speculative_config: no proposer for method={method!r}; the "
                         f"registry holds {sorted(PROPOSERS)}")
    module, name = PROPOSERS[method].rsplit(".", 1)
    return getattr(importlib.import_module(module), name)

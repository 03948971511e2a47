"""The speculative-decoding counters, with vLLM's names, cumulative for the engine's life.

Why this module exists: whether speculation pays is one number, the mean acceptance length
(1 + accepted / drafts: tokens each verify step emits per request), and where it fails is a
second, the acceptance at each position. vLLM's metrics name them
``spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
``..._num_accepted_tokens_per_pos``; ``llm.stats``, ``/metrics`` and ``bench`` read them here.

>>> s = SpecDecodingStats(); s.observe(4, 2); s.observe(4, 4)
>>> s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.accepted_per_pos
(2, 8, 6, [2, 2, 1, 1])
>>> s.mean_acceptance_length
4.0
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecDecodingStats:
    num_drafts: int = 0  # verify steps that checked proposals, summed over requests
    num_draft_tokens: int = 0  # proposals checked
    num_accepted_tokens: int = 0  # proposals the target accepted
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: accepted at position i

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's verify: ``num_draft_tokens`` proposals, the first ``num_accepted``
        of them accepted (the run ends at the first rejection)."""
        if not 0 <= num_accepted <= num_draft_tokens:
            raise ValueError(f"{num_accepted} accepted of {num_draft_tokens} proposals")
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft_tokens:
            self.accepted_per_pos += [0] * (num_draft_tokens - len(self.accepted_per_pos))
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step and request: 1 + accepted / drafts (1.0: none)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed (0.0 when nothing was proposed)."""
        return (self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens
                else 0.0)

    def copy(self) -> SpecDecodingStats:
        return SpecDecodingStats(self.num_drafts, self.num_draft_tokens,
                                 self.num_accepted_tokens, list(self.accepted_per_pos))

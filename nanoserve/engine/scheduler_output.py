"""What one ``schedule()`` call decided: the work of one forward, and who gets a token.

Why this module exists: the scheduler decides and the engine computes, and this is the whole of
what passes between them (vLLM keeps it in ``core/sched/output.py`` for the same reason). A
request is in ``chunks`` when this step computes prompt tokens for it (a newcomer, a continued
chunked prefill, or a resumed preemption), in ``decode`` when it computes the one token it
sampled last (and the proposals in its ``spec_token_ids`` after it, Day 76); ``sampled`` is who
gets a new token, which a chunk short of its prompt's end does not. ``mixed`` says the engine
runs both kinds in one forward (chunked prefill, Day 41). ``held`` (static waves, Day 29) are
finished members of a wave whose rows are still computed, in place, beside ``decode``, and
sampled for nobody.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanoserve.engine.compact import RowMove
from nanoserve.engine.request import Request


@dataclass(frozen=True, slots=True)
class Chunk:
    """Prefill work for one request this iteration: its tokens ``start .. start + n - 1``."""

    request: Request
    start: int  # tokens already cached before this step
    n: int  # tokens this step computes

    @property
    def completes(self) -> bool:
        """Does this chunk reach the request's last token (so the step samples for it)?"""
        return self.start + self.n == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    admitted: list[Request] = field(default_factory=list)  # newly running: prefill starts
    decode: list[Request] = field(default_factory=list)  # running: one decode token each
    finished: list[Request] = field(default_factory=list)  # released this call: answers ready
    preempted: list[Request] = field(default_factory=list)  # sent back to waiting this call
    moves: list[RowMove] = field(default_factory=list)  # rows relabelled this call (compact_rows)
    chunks: list[Chunk] = field(default_factory=list)  # prefill work: admitted and continuing
    mixed: bool = False  # one forward carries chunks and decodes (chunked prefill, Day 41)
    held: list[Request] = field(default_factory=list)  # static waves: finished, still computed

    @property
    def num_scheduled(self) -> int:
        return len(self.chunks) + len(self.decode)

    @property
    def scheduled(self) -> list[Request]:
        return [c.request for c in self.chunks] + self.decode

    @property
    def sampled(self) -> list[Request]:
        """The requests that get a token from this step: every decode, and each chunk that
        completes its prefill. A chunk short of the end emits nothing."""
        return [c.request for c in self.chunks if c.completes] + self.decode

    @property
    def num_batched_tokens(self) -> int:
        """Tokens this step computes: what the token budget caps."""
        return sum(c.n for c in self.chunks) + sum(1 + len(r.spec_token_ids)
                                                   for r in self.decode)

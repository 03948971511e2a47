"""Backing off: a request whose proposals keep being rejected stops getting them for a while.

Why this module exists: a proposal costs something even when it is wrong. The verify step puts
1 + k tokens through the model instead of one, and the proposer spends host time finding them;
on a workload where nothing repeats, n-gram lookup still finds the odd spurious match, and every
one of them is a verify step that keeps nothing. vLLM proposes for every request on every step;
this is nanoserve's own rule (``BackoffPolicy``), off unless a proposer is given one, so that the
same config accepts the same tokens as vLLM unless asked otherwise.

The rule, per request: after ``after`` verify steps in a row that accepted nothing, propose
nothing for ``pause`` steps; then propose again (a probe). A probe that accepts nothing starts
the next pause at once, twice as long (up to ``max_pause``); one accepted token anywhere resets
the count and the pause. A step counts when the request is asked for (``gate``), whether it is
paused or not; a step where the proposer found nothing to propose is no verify step and counts
neither way.

How acceptance is known without the engine saying: when ``gate`` is called, the proposal last
``record``-ed for the request has been verified, and the request's output has grown by the
accepted proposals and one token of the target's own. The accepted count is the common prefix
of the proposal and the new tokens less the last. (A step whose proposals the scheduler cut to
none, at the very end of ``max_tokens``, reads as a miss: a rare, harmless undercount.)

>>> from types import SimpleNamespace as R
>>> b = AcceptanceBackoff(BackoffPolicy(after=2, pause=3, max_pause=8))
>>> r = R(request_id="a", output_token_ids=[7])
>>> steps = []
>>> for _ in range(10):  # every proposal is rejected: the target always writes 0
...     go = b.gate(r)
...     steps.append(int(go))
...     if go:
...         b.record(r, [1, 2])
...     r.output_token_ids.append(0)
>>> steps  # two misses, pause 3, a probe that misses, pause 6, ...
[1, 1, 0, 0, 0, 1, 0, 0, 0, 0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanoserve.engine.request import Request


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """``after`` missed verify steps in a row -> no proposals for ``pause`` steps, doubling
    after each missed probe up to ``max_pause``."""

    after: int = 4
    pause: int = 8
    max_pause: int = 128

    def __post_init__(self):
        for name in ("after", "pause", "max_pause"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BackoffPolicy: {name} must be an int >= 1, got {value!r}")
        if self.max_pause < self.pause:
            raise ValueError(f"BackoffPolicy: max_pause={self.max_pause} is below "
                             f"pause={self.pause}")


class _Track:
    """One request's record: its pending proposal and where its output stood then."""

    __slots__ = ("request", "proposal", "out_len", "misses", "skip", "pause")

    def __init__(self, request, pause: int):
        self.request = request  # the object, so that a reused request id starts afresh
        self.proposal: list[int] = []
        self.out_len = 0
        self.misses = 0  # verify steps in a row that accepted nothing
        self.skip = 0  # steps left in the current pause
        self.pause = pause  # the next pause's length


class AcceptanceBackoff:
    """Per-request state for ``policy``, keyed by request id; ``retain`` forgets the gone."""

    def __init__(self, policy: BackoffPolicy):
        self.policy = policy
        self.tracks: dict[str, _Track] = {}

    def gate(self, r: Request) -> bool:
        """Whether to propose for ``r`` this step (after reading how its last proposal did)."""
        t = self.tracks.get(r.request_id)
        if t is None or t.request is not r:
            t = self.tracks[r.request_id] = _Track(r, self.policy.pause)
        if t.proposal:
            grown = len(r.output_token_ids) - t.out_len
            if grown > 0:  # verified: accepted proposals, then the target's own token
                new = r.output_token_ids[t.out_len:t.out_len + grown - 1]
                accepted = 0
                for p, o in zip(t.proposal, new, strict=False):
                    if p != o:
                        break
                    accepted += 1
                if accepted:
                    t.misses, t.pause = 0, self.policy.pause
                else:
                    t.misses += 1
            t.proposal = []
        if t.skip:
            t.skip -= 1
            return False
        if t.misses >= self.policy.after:
            t.skip = t.pause - 1  # this step is the pause's first
            t.pause = min(2 * t.pause, self.policy.max_pause)
            t.misses = self.policy.after - 1  # so that one missed probe pauses again
            return False
        return True

    def record(self, r: Request, proposal: list[int]) -> None:
        """``proposal`` was handed to ``r`` for the next verify step."""
        t = self.tracks[r.request_id]
        t.proposal, t.out_len = list(proposal), len(r.output_token_ids)

    def retain(self, request_ids) -> None:
        """Forget every request not in ``request_ids``."""
        self.tracks = {i: self.tracks[i] for i in request_ids if i in self.tracks}

    def forget(self, request_id: str) -> None:
        self.tracks.pop(request_id, None)

"""Day 78 snapshot (frozen): prompt lookup, and what it would have accepted on a finished text.

Prompt lookup proposes without a model. Over a request's tokens (prompt, then output so far):
take the last ``n`` tokens for the largest ``n`` from ``lookup_max`` down to ``lookup_min``
that also occur earlier with at least one token after them; of those earlier occurrences take
the first; propose the (at most ``k``) tokens that followed it. No such ``n``: no proposal, and
the next step is an ordinary decode step.

Because lookup reads only tokens, and greedy speculation never changes the tokens, what lookup
proposes and what the target accepts are both fixed by the finished output. ``replay`` walks an
output the way the engine does (the first token from the prefill, then one verify or plain step
at a time, proposals cut so that no step writes past the last token) and counts what the
engine's counters would count.

>>> propose([1, 2, 3, 4, 2, 3], 2, 3, k=4)   # [2, 3] first occurs at 1; three tokens follow
[4, 2, 3]
>>> propose([7, 1, 2, 9, 1, 2, 8, 1, 2], 2, 2, k=2)   # three earlier [1, 2]: the first wins
[9, 1]
>>> propose([5, 6, 7, 8], 2, 5, k=4)          # nothing repeats: no proposal
[]
>>> r = replay([1, 2, 3, 4, 1, 2], [3, 4, 1, 9, 5, 6], 2, 2, k=4)   # 4, 1 kept, 2 rejected
>>> r.drafts, r.proposed, r.accepted, r.per_pos, r.steps              # then two plain steps
(1, 4, 2, [1, 1, 0, 0], 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field


def propose(tokens: list[int], lookup_min: int, lookup_max: int, k: int) -> list[int]:
    """The tokens after the first earlier occurrence of the longest matching suffix."""
    total = len(tokens)
    for n in range(min(lookup_max, total - 1), lookup_min - 1, -1):
        suffix = tokens[total - n:]
        for start in range(total - n):  # start + n < total: a token follows
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


@dataclass(slots=True)
class Replay:
    """The speculative counters one request's output implies (vLLM's names, shortened)."""

    drafts: int = 0  # verify steps: steps that had proposals
    proposed: int = 0  # proposals verified
    accepted: int = 0  # of them, kept
    per_pos: list[int] = field(default_factory=list)  # [i]: steps that kept proposal i
    steps: int = 0  # decode steps after the prefill: verify steps and plain ones


def replay(prompt: list[int], output: list[int], lookup_min: int, lookup_max: int,
           k: int) -> Replay:
    """What prompt lookup proposes and the target keeps while ``output`` (greedy, stopped only
    by its length) is written after ``prompt``."""
    r = Replay(per_pos=[0] * k)
    done = 1  # the prefill wrote the first token
    while done < len(output):
        guess = propose(prompt + output[:done], lookup_min, lookup_max, k)
        guess = guess[:len(output) - done - 1]  # a step never writes past the last token
        kept = 0
        while kept < len(guess) and guess[kept] == output[done + kept]:
            kept += 1
        if guess:
            r.drafts += 1
            r.proposed += len(guess)
            r.accepted += kept
            for i in range(kept):
                r.per_pos[i] += 1
        r.steps += 1
        done += kept + 1
    return r

"""What rank 0 tells the workers once per forward: one int64 message, one broadcast.

Why this module exists: a worker needs exactly what rank 0's ``Engine`` is about to run, never
the requests, the sampler or the logits. A message is a flat int64 list:

    [kind, B, nhold, journal_len, rows(B), lens(B), hold(nhold), journal(journal_len),
     tokens(sum(lens)), want(B, SCORE only)]

``kind`` is ``PREFILL``, ``DECODE``, ``SCORE`` (a verify step) or ``STOP``. A ``SCORE`` also
carries how many positions' logits each row wants (``Engine.score``'s ``want``): the LM head's
gather joins every rank's logits, so every rank must compute as many rows of them. It travels in a
fixed ``HEADER`` of int64s whose first cell is the message's length: a decode step of up to a
few hundred rows fits, so it costs one broadcast of ``HEADER * 8`` bytes; a longer message (a
prompt's tokens) sends its tail in a second broadcast of exactly the rest. Per step, never per
token in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PREFILL, DECODE, STOP, SCORE = 1, 2, 3, 4  # SCORE: a verify step's packed forward (Day 76)
HEADER = 1024  # int64 cells in the first broadcast; cell 0 is the message's length


@dataclass(slots=True)
class Message:
    kind: int
    rows: list[int]
    token_lists: list[list[int]]
    hold: frozenset[int]
    journal: list[int]
    want: list[int] = field(default_factory=list)  # SCORE: logits wanted per row


def encode(m: Message) -> list[int]:
    lens = [len(t) for t in m.token_lists]
    hold = sorted(m.hold)
    flat = [t for toks in m.token_lists for t in toks]
    want = list(m.want) if m.kind == SCORE else []
    if len(want) != (len(m.rows) if m.kind == SCORE else 0):
        raise ValueError(f"a SCORE message wants one count per row: rows {m.rows}, want {want}")
    return [m.kind, len(m.rows), len(hold), len(m.journal), *m.rows, *lens, *hold, *m.journal,
            *flat, *want]


def decode(ints: list[int]) -> Message:
    kind, B, nh, nj = ints[:4]
    i = 4
    rows, lens = ints[i:i + B], ints[i + B:i + 2 * B]
    i += 2 * B
    hold, journal = frozenset(ints[i:i + nh]), ints[i + nh:i + nh + nj]
    i += nh + nj
    token_lists = []
    for n in lens:
        token_lists.append(ints[i:i + n])
        i += n
    want = ints[i:i + B] if kind == SCORE else []
    return Message(kind, rows, token_lists, hold, journal, want)


def send(comm, m: Message) -> None:
    """Rank 0: one broadcast of the header (and one of the tail if the message is longer)."""
    ints = encode(m)
    head = torch.zeros(HEADER, dtype=torch.long)
    n = len(ints)
    head[0] = n
    first = ints[:HEADER - 1]
    head[1:1 + len(first)] = torch.tensor(first, dtype=torch.long)
    comm.broadcast(head.to(comm.device))
    if n > HEADER - 1:
        comm.broadcast(torch.tensor(ints[HEADER - 1:], dtype=torch.long, device=comm.device))


def receive(comm) -> Message:
    """A worker: the next message from rank 0."""
    head = comm.broadcast(torch.zeros(HEADER, dtype=torch.long, device=comm.device)).cpu()
    n = int(head[0])
    ints = head[1:1 + min(n, HEADER - 1)].tolist()
    if n > HEADER - 1:
        tail = torch.zeros(n - (HEADER - 1), dtype=torch.long, device=comm.device)
        ints += comm.broadcast(tail).cpu().tolist()
    return decode(ints)

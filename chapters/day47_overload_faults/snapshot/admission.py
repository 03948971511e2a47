"""Day 47 snapshot (frozen): the admission rule at the server's door.

A request may wait only if fewer than ``max_waiting`` requests already wait; otherwise it is
refused (a 429 with ``Retry-After``). "Waiting" means two places: the inbox, where a request sits
between the event loop accepting it and the engine thread's next iteration, and the scheduler's
queue, where it sits until a slot is free. ``Door`` keeps both counts under one lock, and the
engine's move of the inbox into the queue happens under that lock too, so no request is ever
counted in neither place or in both. A request that asks for ``k`` places (``n`` choices) gets
all of them or none.

``count_inbox=False`` is the tempting mistake: count only the scheduler's queue. The queue only
grows at the top of an iteration, so a burst that arrives within one iteration sees it empty
and gets in whole.

    >>> replay("aaaaaa", max_waiting=4)
    (4, 2, 4)
    >>> replay("aaaaaa", max_waiting=4, count_inbox=False)
    (6, 0, 6)
    >>> replay("aaaaaiaa", max_waiting=4, count_inbox=False)
    (5, 2, 5)
"""

from __future__ import annotations

import threading


class Door:
    def __init__(self, max_waiting: int, count_inbox: bool = True):
        self.max_waiting = max_waiting
        self.count_inbox = count_inbox
        self.inbox = 0  # accepted, not yet seen by the engine thread
        self.queue = 0  # in the scheduler's waiting queue
        self.admitted = self.refused = self.peak = 0
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """What the rule sees."""
        return self.inbox + self.queue if self.count_inbox else self.queue

    def arrive(self, k: int = 1) -> bool:
        """A request that needs ``k`` places: True if admitted, False for a 429."""
        with self._lock:
            if self.waiting + k > self.max_waiting:
                self.refused += 1
                return False
            self.inbox += k
            self.admitted += 1
            self.peak = max(self.peak, self.inbox + self.queue)
            return True

    def take_inbox(self, free_slots: int = 0) -> int:
        """The engine thread's iteration top: the inbox joins the queue, then up to
        ``free_slots`` leave it for the running batch. Returns how many were scheduled."""
        with self._lock:
            self.queue += self.inbox
            self.inbox = 0
            scheduled = min(free_slots, self.queue)
            self.queue -= scheduled
            return scheduled


def replay(events: str, max_waiting: int, count_inbox: bool = True,
           free_slots: int = 0) -> tuple[int, int, int]:
    """``events``: ``a`` an arrival, ``i`` an engine iteration (with ``free_slots`` free).
    Returns (admitted, refused, the most requests that were really waiting at once)."""
    door = Door(max_waiting, count_inbox)
    for e in events:
        if e == "a":
            door.arrive()
        elif e == "i":
            door.take_inbox(free_slots)
        else:
            raise ValueError(f"unknown event {e!r}: use 'a' (arrival) or 'i' (iteration)")
    return door.admitted, door.refused, door.peak

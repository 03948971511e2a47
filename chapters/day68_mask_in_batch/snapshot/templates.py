"""Day 68 snapshot (frozen): which requests compile a grammar and which copy a cached one.

The engine keeps one compiled template per distinct spec, at most ``capacity`` of them, and
forgets the least recently used when a new one would overflow it. A request whose spec is in
the cache copies its template (a hit, and the entry becomes the most recently used); any other
request compiles (a miss). This is that policy with no grammar library at all: keys in, counts
out, so the live backend's counters can be held against it.

>>> lru = TemplateLRU(capacity=2)
>>> [lru.request(k) for k in "abacbd"]
['compile', 'compile', 'copy', 'compile', 'compile', 'compile']
>>> lru.compiled, lru.hits, list(lru.keys)
(5, 1, ['b', 'd'])
"""

from __future__ import annotations

from collections import OrderedDict


class TemplateLRU:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.keys: OrderedDict[str, None] = OrderedDict()
        self.compiled = self.hits = 0

    def request(self, key: str) -> str:
        """One request with spec ``key``: 'copy' from the cache or 'compile' (and cache)."""
        if key in self.keys:
            self.keys.move_to_end(key)
            self.hits += 1
            return "copy"
        self.keys[key] = None
        self.compiled += 1
        if len(self.keys) > self.capacity:
            self.keys.popitem(last=False)
        return "compile"

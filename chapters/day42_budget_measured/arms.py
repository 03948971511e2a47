"""Arms of a serving measurement: one ``nanoserve serve`` per engine setting, measured in turns.

Days 42 and 45 compare engine settings (chunking off, budgets, prefix caching on and off) over
HTTP, the way a user meets them. Each setting is an *arm*: its own ``nanoserve serve`` process on
a free port of 127.0.0.1 (``nanoserve.bench.local_server``, the path ``nanoserve bench serve``
takes without ``--url``), on the shipped model in float32. The servers start together and stay up
for the whole measurement, so a round can visit every arm back to back, and rounds interleave:
a burst of load from another process on this shared machine lands on one arm's run of one round,
not on one arm.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time

from chapters.common import SHIPPED

SERVER = dict(dtype="float32", max_num_seqs=8)  # every arm's server, beside its own flags
# The engine these days measured: Day 41's, before the C++ ops of Days 54-55 (which the
# package now turns on by default). Pinned, so a rerun measures the same servers.
BEFORE_KERNELS = ("--kernels", "off", "--attention", "gathered")
# The arms run side by side on one machine. Left at threads_bind=auto, every server would pin its
# compute threads to the same cores and they would take turns on them: a budget's cost would
# read as whichever server the OS scheduler starved. Unpinned, as these days' engine was.
UNPINNED = ("--threads-bind", "nobind")
SERVER_TIMEOUT_S = 240.0  # a cold start on a busy 2-core machine
RUN_LIMIT_S = 120.0  # one arm's run of one round: past it, unfinished requests count as failed


@contextlib.contextmanager
def servers(arms: dict[str, tuple[str, ...]]):
    """``{arm: base URL}``, every server healthy; all of them stopped on the way out."""
    from nanoserve.bench.local_server import local_server

    managers = {name: local_server(SHIPPED, timeout_s=SERVER_TIMEOUT_S,
                                   extra_args=(*BEFORE_KERNELS, *UNPINNED, *flags), **SERVER)
                for name, flags in arms.items()}
    with contextlib.ExitStack() as stack:
        with concurrent.futures.ThreadPoolExecutor(len(managers)) as pool:
            started = {name: pool.submit(cm.__enter__) for name, cm in managers.items()}
            urls, error = {}, None
            for name, fut in started.items():
                try:
                    urls[name] = fut.result().url
                    stack.push(managers[name].__exit__)
                except Exception as e:  # the others still get stopped by the stack
                    error = error or e
        if error is not None:
            raise error
        yield urls


def measure(arms: dict[str, tuple[str, ...]], rounds: int, bench, deadline_s: float = 420.0
            ) -> list[dict[str, object]]:
    """``rounds`` rounds; each calls ``bench(arm, url, round)`` for every arm, the order rotated
    one place per round. Returns one ``{arm: result}`` per round. Past ``deadline_s`` no new
    round starts (the measurement must end; a claim then judges the rounds it has)."""
    out: list[dict[str, object]] = []
    names = list(arms)
    t0 = time.monotonic()
    with servers(arms) as urls:
        for r in range(rounds):
            if out and time.monotonic() - t0 > deadline_s:
                break
            order = names[r % len(names):] + names[:r % len(names)]
            out.append({name: bench(name, urls[name], r) for name in order})
    return out

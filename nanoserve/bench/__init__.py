"""Benchmarks and harnesses that the chapters' tables come from.

Why this package exists: every number a chapter states about speed or scheduling is measured by
a command here (``nanoserve bench ...``, ``python -m nanoserve.bench.<name>``), one file per
benchmark, beside the shapes, workloads, hardware descriptions and peer adapters they share.

May import: everything below it (ARCHITECTURE.md), through public names only.
"""


def run_sync(coro):
    """``asyncio.run(coro)``, also when the caller already runs an event loop (a notebook
    cell): then the coroutine gets a thread and a loop of its own."""
    import asyncio
    import concurrent.futures

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()

"""A real nanoserve server on 127.0.0.1, in this process, for the serving chapters (38-40).

Why this module exists: the serving days' numbers come from real HTTP against the real server:
``build_app`` (``nanoserve/entrypoints/openai/app.py``) over an ``AsyncLLM`` built from an
``EngineConfig`` for the shipped nanoserve-tiny, served by uvicorn on a free port of 127.0.0.1 in
a background thread. ``live_server()`` starts it, waits for ``/health``, yields a handle, and
always stops it; the pool is read from ``engine.snapshot()``. Days 39, 40, 46 and 47 import it
from here. It is not a snapshot: it drives the live package on purpose.

    with live_server(max_num_seqs=4) as live:
        httpx.get(live.url + "/v1/models").json()
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

from chapters.common import SHIPPED

# The server takes a chat template (``--chat-template``) over the shipped model's own: this
# chapter's numbers were recorded with this one, before nanoserve-tiny had a template (Day 69).
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MODEL_NAME = "nanoserve-tiny"


class PoolReading(NamedTuple):
    num_free: int
    num_blocks: int


@dataclass
class Live:
    url: str
    engine: object  # the AsyncLLM; its core is engine.core, the model runner engine.core.engine
    app: object  # the FastAPI app

    @property
    def pool(self) -> PoolReading:
        """The KV pool now, from the engine's snapshot."""
        snap = self.engine.snapshot()
        return PoolReading(snap.num_free_blocks, snap.num_blocks)

    def idle(self, timeout: float = 10.0) -> bool:
        """Wait (bounded) until nothing runs or waits and every block is free."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            e = self.engine
            if (e.num_running == 0 and e.num_waiting == 0 and not e._streams
                    and self.pool.num_free == self.pool.num_blocks):
                return True
            time.sleep(0.01)
        return False


@contextlib.contextmanager
def live_server(max_num_seqs: int = 4, num_kv_blocks: int = 64, block_size: int = 4,
                max_waiting: int | None = None, api_key: str | None = None,
                max_body_bytes: int = 4 << 20, threads: int = 1):
    """The shipped model (float32) behind the OpenAI API on 127.0.0.1:<free port>."""
    import httpx
    import torch
    import uvicorn

    from nanoserve.async_engine import AsyncLLM
    from nanoserve.bench.local_server import free_port
    from nanoserve.config import EngineConfig
    from nanoserve.entrypoints.openai.app import build_app

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    config = EngineConfig(SHIPPED, dtype="float32", block_size=block_size,
                          num_kv_blocks=num_kv_blocks, max_num_seqs=max_num_seqs)
    engine = AsyncLLM(config, max_waiting=max_waiting)
    app = build_app(engine, MODEL_NAME, api_key=api_key, chat_template=CHAT_TEMPLATE,
                    max_body_bytes=max_body_bytes)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           lifespan="on", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, name="day38-uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the server did not turn healthy within 60 s")
            time.sleep(0.05)
        yield Live(url, engine, app)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        torch.set_num_threads(before)

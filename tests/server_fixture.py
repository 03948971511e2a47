"""A real uvicorn server on 127.0.0.1 in a background thread, and raw-socket helpers.

Why this module exists: the server's promises (SSE framing, a hang-up aborting its request, 429
at the door) live in the socket and the event loop, so the tests talk to a real server over real
TCP rather than to an in-process test client. The server runs in a thread of the test process so
a test can also look at the engine it serves (``engine.snapshot()``) directly.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import uvicorn


def wait_for(pred, timeout: float = 10.0, interval: float = 0.01, what: str = "condition"):
    """Poll ``pred`` until it is truthy; bounded in time (and so in count)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class ServerThread:
    """``with ServerThread(app) as s: s.url`` - serving until the block ends."""

    def __init__(self, app):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))  # a free port, held from here on: no race
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="uvicorn", daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        wait_for(lambda: self.server.started, 30, what="uvicorn to start")
        wait_for(lambda: httpx.get(self.url + "/health").status_code == 200, 30,
                 interval=0.05, what="/health to say 200")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "uvicorn did not stop"


def error_of(r: httpx.Response, status: int) -> dict:
    """The error object of a refusal, checked to be OpenAI's shape with no traceback in it."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert "Traceback" not in r.text
    return err


def raw_post(port: int, path: str, body: dict, headers: dict | None = None) -> socket.socket:
    """Send one HTTP/1.1 POST on a fresh socket and return the socket, unread."""
    data = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
            f"Content-Length: {len(data)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    return s


def read_until(s: socket.socket, marker: bytes | None, limit: int = 1 << 20) -> bytes:
    """Read from ``s`` until ``marker`` has arrived, or to EOF when it is None; bounded by
    ``limit`` bytes. (A marker meant never to arrive is a bug waiting: the model once wrote the
    word "never" into a stream that was to be read to its end.)"""
    buf = b""
    while (marker is None or marker not in buf) and len(buf) < limit:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf

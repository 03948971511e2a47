"""Day 38 snapshot (frozen): the smallest OpenAI-compatible server worth the name.

A bare ASGI application, standard library only, so no web framework's upgrade can change what
it says. One route, ``POST /v1/completions`` with a prompt of token ids, and
``GET /v1/models``; every failure in OpenAI's shape, ``{"error": {"message", "type", "param",
"code"}}``, with the HTTP status as ``code`` and ``param`` naming the field at fault. The model
is whatever ``generate`` is: a blocking ``generate(prompt_ids, max_tokens) -> list[int]`` (Day
7's greedy loop fits), run on a worker thread so the event loop stays free. Usage is counted
from ids, never guessed: ``prompt_tokens = len(prompt)``, ``completion_tokens = len(output)``.

    app = build_app(lambda ids, n: generate_cached(model, ids, n).token_ids,
                    "nanoserve-tiny", vocab_size=2048, max_model_len=1024)
    # serve with any ASGI server, or call through httpx.ASGITransport(app=app)
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               413: "RequestEntityTooLarge", 429: "RateLimitError", 500: "InternalServerError"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"),
                      "param": param, "code": status}}


def _int(body: dict, name: str, default: int | None, low: int) -> int:
    """A strict integer field: ``"10"`` and ``true`` are refused, as the live server does."""
    v = body.get(name, default)
    if type(v) is not int:
        raise ApiError(400, f"{name}: Input should be a valid integer", name)
    if v < low:
        raise ApiError(400, f"{name}: Input should be greater than or equal to {low}", name)
    return v


def build_app(generate, model_name: str, vocab_size: int, max_model_len: int):
    async def completions(body: dict) -> dict:
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt)):
            raise ApiError(400, "prompt: a non-empty list of token ids is required", "prompt")
        max_tokens = _int(body, "max_tokens", 16, 1)
        model = body.get("model")
        if model is not None and model != model_name:
            raise ApiError(404, f"the model {model!r} does not exist; this server serves "
                                f"{model_name!r}", "model")
        if any(not 0 <= t < vocab_size for t in prompt):
            raise ApiError(400, f"a token id is outside the vocabulary (vocab_size="
                                f"{vocab_size})", "prompt")
        if len(prompt) + max_tokens > max_model_len:
            raise ApiError(400, f"prompt plus max_tokens is over {max_model_len}", "max_tokens")
        ids = await asyncio.to_thread(generate, prompt, max_tokens)
        p, c = len(prompt), len(ids)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": model_name,
                "choices": [{"index": 0, "token_ids": ids,
                             "finish_reason": "length" if c == max_tokens else "stop"}],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}

    async def handle(method: str, path: str, raw: bytes) -> dict:
        if (method, path) == ("GET", "/v1/models"):
            return {"object": "list", "data": [{"id": model_name, "object": "model",
                                                "max_model_len": max_model_len}]}
        if (method, path) != ("POST", "/v1/completions"):
            raise ApiError(404, f"Not Found: {method} {path}")
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise ApiError(400, f"malformed JSON in the request body: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return await completions(body)

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            status, payload = 200, await handle(scope["method"], scope["path"], raw)
        except ApiError as e:
            status, payload = e.status, error_body(e.status, e.message, e.param)
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    return app

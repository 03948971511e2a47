"""``build_app``: the OpenAI-compatible HTTP API over the async engine, assembled.

Why this module exists: the official ``openai`` client, curl and every tool built for vLLM should
work against nanoserve unchanged. The endpoints live one family per file, as in vLLM's
``entrypoints/openai/`` (``completions.py``, ``chat.py``, ``tokenization.py``); this file puts
one app together over one engine: its ``ServingContext``, its lifespan (start the engine, warm
it, drain it on shutdown), the small routes an operator probes (``/health``, ``/version``,
``/metrics``, ``/v1/models``), the API key, and the error handlers (``errors.py``). It owns no
tokens, blocks or slots: those belong to the engine.

Three promises shape the whole layer:

- **Every failure is an OpenAI error**, ``{"error": {"message", "type", "param", "code"}}``, with
  ``param`` naming the field where there is one; never a traceback (``errors.py``).
- **A request is all or nothing**: ``n`` choices (times every prompt) are ``n`` engine requests,
  opened together; if one is refused the others are aborted and the client gets the error,
  before any byte of a stream (``fanout.py``).
- **A client that hangs up costs nothing**: a disconnect aborts every engine request behind it,
  streaming or not (``fanout.py``, ``streaming.py``).

``/health`` says 200 only once one token has gone through the whole path (the warm-up), and 503
while the model loads, while the server drains, or after the engine thread has died.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from contextlib import asynccontextmanager
from importlib.metadata import version as package_version

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nanoserve.async_engine import Overloaded
from nanoserve.entrypoints.openai import chat, completions, tokenization
from nanoserve.entrypoints.openai.context import ServingContext, serving
from nanoserve.entrypoints.openai.errors import ApiError, add_exception_handlers, error_response
from nanoserve.entrypoints.openai.protocol import ModelCard, ModelList
from nanoserve.sampling.params import SamplingParams

log = logging.getLogger("nanoserve.server")

router = APIRouter()  # the routes every app has, outside the API key
models_router = APIRouter()


async def check_key(request: Request) -> None:
    """The API key, when the app has one: ``Authorization: Bearer KEY``, compared in constant
    time. ``/health``, ``/version`` and ``/metrics`` stay open."""
    api_key = serving(request).api_key
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(
            token.strip().encode(), api_key.encode()):
        raise ApiError(401, "invalid or missing API key (Authorization: Bearer ...)")


@router.get("/health")
async def health(request: Request):
    ctx = serving(request)
    if ctx.engine.errored:
        return error_response(503, "the engine thread has died")
    if ctx.state.draining:
        return error_response(503, "the server is shutting down")
    if not ctx.state.ready:
        return error_response(503, "the model is loading")
    return {"status": "ok"}


@router.get("/version")
async def version():
    return {"version": package_version("nanoserve")}


@router.get("/metrics")
async def prometheus(request: Request):
    return Response(generate_latest(serving(request).metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)


@models_router.get("/models")
async def models(request: Request):
    ctx = serving(request)
    card = ModelCard(id=ctx.served_model_name, root=ctx.served_model_name,
                     max_model_len=ctx.max_model_len)
    return ModelList(data=[card]).model_dump()


async def warm_up(app: FastAPI) -> None:
    """One token through the whole path, so /health says 200 only when a request works."""
    ctx: ServingContext = app.state.serving
    first = getattr(ctx.tokenizer, "bos_token_id", None) or 0
    try:
        async for _ in ctx.engine.generate([first], SamplingParams(temperature=0, max_tokens=1,
                                                                   ignore_eos=True),
                                           f"warmup-{uuid.uuid4().hex}"):
            pass
        app.state.ready = True
    except Overloaded:
        app.state.ready = True
    except Exception as e:  # noqa: BLE001 - /health reports it
        log.error("warm-up failed: %s: %s", type(e).__name__, e)


@asynccontextmanager
async def lifespan(app: FastAPI):
    engine = app.state.serving.engine
    engine.start()
    warm = asyncio.create_task(warm_up(app))
    yield
    app.state.draining = True
    warm.cancel()
    await engine.shutdown(app.state.drain_timeout)


def build_app(engine, served_model_name: str, api_key: str | None = None,
              chat_template: str | None = None, max_body_bytes: int = 4 << 20,
              **tooling) -> FastAPI:
    """The HTTP API over ``engine`` (an ``AsyncLLM``); its lifespan starts and warms the
    engine, and shuts it down (aborting what is left after ``app.state.drain_timeout``).
    ``tooling``: ``enable_auto_tool_choice``, ``tool_call_parser``, ``reasoning_parser``."""
    app = FastAPI(title="nanoserve", version=package_version("nanoserve"), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ready = False
    app.state.draining = False
    app.state.drain_timeout = 5.0
    app.state.serving = ctx = ServingContext.build(
        engine, served_model_name, app.state, api_key=api_key, chat_template=chat_template,
        max_body_bytes=max_body_bytes, **tooling)
    app.state.metrics = ctx.metrics
    app.state.engine = engine
    add_exception_handlers(app)
    auth = [Depends(check_key)]
    app.include_router(router)
    app.include_router(models_router, prefix="/v1", dependencies=auth)
    app.include_router(completions.router, prefix="/v1", dependencies=auth)
    app.include_router(chat.router, prefix="/v1", dependencies=auth)
    app.include_router(tokenization.router, dependencies=auth)
    return app

"""``build_app``: the OpenAI-compatible HTTP API over the async engine.

Why this module exists: the official ``openai`` client, curl and every tool built for vLLM should
work against nanoserve unchanged. This file is the thin layer that makes that so. It parses and
checks the JSON (``protocol.py``), turns a request into one engine request per choice, and turns
the engine's deltas back into OpenAI's objects, whole or as an SSE stream. It owns no tokens,
blocks or slots: those belong to the engine.

Three promises shape the code:

- **Every failure is an OpenAI error**, ``{"error": {"message", "type", "param", "code"}}``, with
  ``param`` naming the field where there is one; never a traceback.
- **A request is all or nothing**: ``n`` choices (times every prompt) are ``n`` engine requests,
  opened together; if one is refused (a bad value, ``Overloaded``) the others are aborted and the
  client gets the error, before any byte of a stream.
- **A client that hangs up costs nothing**: while a response is pending the server watches the
  connection, and a disconnect aborts every engine request behind it, streaming or not.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
import secrets
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from . import __version__
from .async_engine import EngineDead, Overloaded
from .metrics import ServerMetrics
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    Render,
    UsageInfo,
    unsupported_field,
)
from .sampling import SamplingParams

log = logging.getLogger("nanoserve.server")

DISCONNECT_POLL_S = 0.05  # how often a pending response checks that its client is still there
DEFAULT_COMPLETION_TOKENS = 16  # vLLM's default max_tokens for /v1/completions
MAX_REQUESTS_PER_CALL = 256  # prompts x n in one HTTP request: beyond this, send several
ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowed", 413: "RequestEntityTooLarge", 429: "RateLimitError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


class ClientGone(Exception):
    """The client hung up while its response was pending."""


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    info = ErrorInfo(message=message, type=ERROR_TYPES.get(status, "Error"), param=param,
                     code=status)
    return JSONResponse(ErrorResponse(error=info).model_dump(), status, headers=headers)


def as_api_error(e: Exception) -> ApiError:
    """What the client hears about an exception from the engine."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, Overloaded):
        return ApiError(429, str(e), headers={"Retry-After": str(e.retry_after)})
    if isinstance(e, EngineDead):
        return ApiError(503, str(e))
    if isinstance(e, ValueError):  # SamplingParams and the engine name the field first
        m = re.match(r"[a-z_]+", str(e))
        return ApiError(400, str(e), m.group(0) if m and m.group(0) in _FIELDS else None)
    log.error("unexpected %s", type(e).__name__, exc_info=e)
    return ApiError(500, f"internal error ({type(e).__name__})")


_FIELDS = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)


# ---------------------------------------------------------------------------- parsing

def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object, or a 413 / 400. An oversized body is still drained (up to a
    cap) so the client can read the 413 instead of a reset connection. A body sent as anything
    but JSON is refused; one sent with no content type at all is read as JSON."""
    kind = request.headers.get("content-type")
    if kind is not None and kind.split(";")[0].strip().lower() != "application/json":
        raise ApiError(400, f"the request body must be application/json, not {kind!r}")
    length = request.headers.get("content-length", "")
    too_big = length.isdigit() and int(length) > limit
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            too_big = too_big or size > limit
            if not too_big:
                chunks.append(chunk)
            elif size > 16 * limit:
                break
    except ClientDisconnect:
        raise ClientGone() from None
    if too_big:
        raise ApiError(413, f"the request body is over the limit of {limit} bytes")
    try:
        text = b"".join(chunks).decode("utf-8")  # strict: no lone surrogates, no junk bytes
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8: {e}") from None
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        raise ApiError(400, f"malformed JSON in the request body: {e}") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def parse(cls, body: dict):
    bad = unsupported_field(body)
    if bad is not None:
        raise ApiError(400, f"{bad!r} is not supported by nanoserve", bad)
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        errors = e.errors()  # a union reports each member it tried: say up to four
        loc = errors[0]["loc"]
        param = str(loc[0]) if loc else None
        msg = "; ".join(f"{'.'.join(str(x) for x in er['loc'])}: {er['msg']}"
                        for er in errors[:4])
        raise ApiError(400, msg, param) from None


# ---------------------------------------------------------------------------- n engine requests

class Fanout:
    """Several engine requests behind one HTTP request, merged into one stream of
    ``(index, RequestDelta | Exception)``. ``close()`` aborts whatever has not finished."""

    def __init__(self, engine, metrics: ServerMetrics, jobs: list, arrival: float):
        self.engine = engine
        self.rids = [rid for rid, _, _ in jobs]
        self.trackers = [metrics.track(arrival) for _ in jobs]
        self.open = set(range(len(jobs)))
        self.queue: asyncio.Queue = asyncio.Queue()
        self.buffer: list = []
        self.tasks = [asyncio.create_task(self._pump(i, ids, sp))
                      for i, (_, ids, sp) in enumerate(jobs)]

    async def _pump(self, i: int, ids: list[int], sp: SamplingParams) -> None:
        try:
            async for d in self.engine.generate(ids, sp, self.rids[i]):
                self.trackers[i].delta(d)
                self.queue.put_nowait((i, d))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which decides
            self.trackers[i].done = True
            self.queue.put_nowait((i, e))

    async def prime(self) -> None:
        """Wait until every request is accepted and has news; raise the first refusal."""
        seen: set[int] = set()
        while len(seen) < len(self.rids):
            i, item = await self.queue.get()
            if isinstance(item, Exception):
                raise item
            seen.add(i)
            self.buffer.append((i, item))

    async def events(self):
        while self.buffer or self.open:
            i, item = self.buffer.pop(0) if self.buffer else await self.queue.get()
            if isinstance(item, Exception) or item.finished:
                self.open.discard(i)
            yield i, item

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for i in sorted(self.open):
            self.engine.abort(self.rids[i])
            self.trackers[i].abort()
        self.open.clear()


async def until_disconnect(request: Request, aw):
    """Await ``aw`` unless the client hangs up first (then ``ClientGone``)."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        task.cancel()


class SSEResponse(StreamingResponse):
    """An event stream that runs ``on_close`` however it ends: done, failed or cancelled (a
    disconnect cancels the stream, possibly before its generator ever started)."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def sse(obj) -> str:
    return f"data: {obj.model_dump_json()}\n\n"


def failure(item) -> ApiError | None:
    """The error in a stream item: an exception, or a delta that finished with "error"."""
    if isinstance(item, Exception):
        return as_api_error(item)
    if item.finish_reason == "error":
        return ApiError(500, f"the engine failed this request: {item.error}")
    return None


def sse_error(err: ApiError) -> str:
    return sse(ErrorResponse(error=ErrorInfo(message=err.message, param=err.param,
                                             type=ERROR_TYPES.get(err.status, "Error"),
                                             code=err.status)))


async def sse_events(fan: Fanout, choices: list, want_lp: bool, chunk, head=(), tail=None):
    """The SSE body: ``head`` chunks, one ``chunk(choice, delta, first)`` per delta with news,
    then ``tail()`` (the usage chunk) if given, then ``[DONE]``. An error ends it early, as an
    error event, still followed by ``[DONE]``."""
    for h in head:
        yield h
    async for i, item in fan.events():
        err = failure(item)
        if err is not None:
            yield sse_error(err)
            break
        c = choices[i]
        first = not c.token_ids and not c.text
        c.add(item)
        if item.new_text or item.finished or (want_lp and item.new_logprobs):
            yield chunk(c, item, first)
    else:
        if tail is not None:
            yield tail()
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------------------- one choice

@dataclass(slots=True)
class Choice:
    index: int
    prompt_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_output_tokens: int = 0

    def add(self, d) -> None:
        self.text += d.new_text
        self.token_ids += d.new_token_ids
        self.logprobs += d.new_logprobs
        self.num_output_tokens = d.num_output_tokens
        if d.finished:
            self.finish_reason, self.stop_reason = d.finish_reason, d.stop_reason


# ---------------------------------------------------------------------------- the app

def build_app(engine, served_model_name: str, api_key: str | None = None,
              chat_template: str | None = None, max_body_bytes: int = 4 << 20) -> FastAPI:
    """The HTTP API over ``engine`` (an ``AsyncLLM``); its lifespan starts and warms the
    engine, and shuts it down (aborting what is left after ``app.state.drain_timeout``)."""
    llm = engine.llm
    tokenizer = llm.tokenizer
    if tokenizer is not None and chat_template is not None:
        tokenizer = copy.copy(tokenizer)  # the override applies to this app only
        tokenizer.chat_template = chat_template
    render = Render(tokenizer)
    metrics = ServerMetrics(engine, served_model_name)
    max_model_len, vocab_size = llm.max_model_len, llm.config.vocab_size

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        warm = asyncio.create_task(warm_up(app))
        yield
        app.state.draining = True
        warm.cancel()
        await engine.shutdown(app.state.drain_timeout)

    async def warm_up(app: FastAPI) -> None:
        """One token through the whole path, so /health says 200 only when a request works."""
        first = getattr(tokenizer, "bos_token_id", None) or 0
        try:
            async for _ in engine.generate([first], SamplingParams(temperature=0, max_tokens=1,
                                                                   ignore_eos=True),
                                           f"warmup-{uuid.uuid4().hex}"):
                pass
            app.state.ready = True
        except Overloaded:
            app.state.ready = True
        except Exception as e:  # noqa: BLE001 - /health reports it
            log.error("warm-up failed: %s: %s", type(e).__name__, e)

    app = FastAPI(title="nanoserve", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ready = False
    app.state.draining = False
    app.state.drain_timeout = 5.0
    app.state.metrics = metrics
    app.state.engine = engine

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return error_response(e.status, e.message, e.param, e.headers)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, e: ClientGone):
        return Response(status_code=499)  # nobody is listening; nginx's "client closed"

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException):
        msg = f"{e.detail}: {request.method} {request.url.path}"
        return error_response(e.status_code, msg, headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        return error_response(400, "invalid request")

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception):
        log.error("unhandled %s on %s", type(e).__name__, request.url.path, exc_info=e)
        return error_response(500, f"internal error ({type(e).__name__})")

    async def check_key(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
                token.strip().encode(), api_key.encode()):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer ...)")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    # ------------------------------------------------------------------ small routes

    @app.get("/health")
    async def health():
        if engine.errored:
            return error_response(503, "the engine thread has died")
        if app.state.draining:
            return error_response(503, "the server is shutting down")
        if not app.state.ready:
            return error_response(503, "the model is loading")
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @v1.get("/models")
    async def models():
        card = ModelCard(id=served_model_name, root=served_model_name,
                         max_model_len=max_model_len)
        return ModelList(data=[card]).model_dump()

    # ------------------------------------------------------------------ request checks

    def check_common(req) -> None:
        if app.state.draining:
            raise ApiError(503, "the server is shutting down")
        if req.model is not None and req.model != served_model_name:
            raise ApiError(404, f"the model {req.model!r} does not exist; this server "
                                f"serves {served_model_name!r}", "model")
        if req.stream_options is not None and not req.stream:
            raise ApiError(400, "stream_options is only allowed with stream=true",
                           "stream_options")

    def check_ids(ids: list[int], param: str) -> None:
        if not ids:
            raise ApiError(400, f"{param} is empty", param)
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"token id {bad} is outside the vocabulary "
                                f"(vocab_size={vocab_size})", param)
        if len(ids) >= max_model_len:
            raise ApiError(400, f"This model's maximum context length is {max_model_len} "
                                f"tokens. However, your request has {len(ids)} input tokens "
                                f"and generation needs at least one more. Please reduce the "
                                f"length of the input.", param)

    def budget(n_prompt: int, asked: int | None, name: str, default: int | None) -> int | None:
        if asked is None:
            return None if default is None else min(default, max_model_len - n_prompt)
        if n_prompt + asked > max_model_len:
            raise ApiError(400, f"{name!r} is too large: {asked}. This model's maximum context "
                                f"length is {max_model_len} tokens and your request has "
                                f"{n_prompt} input tokens ({asked} > {max_model_len} - "
                                f"{n_prompt}).", name)
        return asked

    def sampling(req, max_tokens: int | None, logprobs: int | None, seed: int | None,
                 names: dict[str, str]) -> SamplingParams:
        kw = dict(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=seed,
                  stop=req.stop, stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
                  skip_special_tokens=req.skip_special_tokens, min_p=req.min_p,
                  presence_penalty=req.presence_penalty,
                  frequency_penalty=req.frequency_penalty,
                  repetition_penalty=req.repetition_penalty, min_tokens=req.min_tokens,
                  logprobs=logprobs)
        try:  # None: the field was not sent, so SamplingParams' default (vLLM's) applies
            return SamplingParams(max_tokens=max_tokens,
                                  **{k: v for k, v in kw.items() if v is not None})
        except ValueError as e:
            err = as_api_error(e)
            err.param = names.get(err.param, err.param)
            raise err from None

    def jobs_for(rid: str, req, prompts: list[list[int]], max_tokens: list[int | None],
                 logprobs: int | None, names: dict[str, str]) -> list:
        jobs = []
        if len(prompts) * req.n > MAX_REQUESTS_PER_CALL:
            raise ApiError(400, f"{len(prompts)} prompts x n={req.n} is over the limit of "
                                f"{MAX_REQUESTS_PER_CALL} per request", "prompt")
        for p, (ids, mt) in enumerate(zip(prompts, max_tokens, strict=True)):
            for j in range(req.n):
                seed = None if req.seed is None else req.seed + j  # differ, yet replay
                if seed is not None and seed >= 2**64:
                    seed -= 2**64  # torch takes seeds below 2**64
                sp = sampling(req, mt, logprobs, seed, names)
                jobs.append((f"{rid}-{p * req.n + j}", ids, sp))
        limit = getattr(engine, "max_waiting", None)
        if limit is not None and len(jobs) > max(limit, 1):  # could never fit: not a retry
            raise ApiError(400, f"{len(jobs)} sequences ({len(prompts)} prompt(s) x n={req.n}) "
                                f"are more than this server queues at once "
                                f"(max_waiting={limit}); retrying will not help", "n")
        if limit is not None and len(jobs) > 1 and engine.num_waiting + len(jobs) > limit:
            raise as_api_error(Overloaded(engine.num_waiting, limit))
        return jobs

    async def open_fanout(request: Request, jobs: list, arrival: float) -> Fanout:
        fan = Fanout(engine, metrics, jobs, arrival)
        try:
            await until_disconnect(request, fan.prime())
        except BaseException as e:
            fan.close()
            if isinstance(e, Exception) and not isinstance(e, ClientGone):
                raise as_api_error(e) from None
            raise
        return fan

    async def collect(request: Request, fan: Fanout, choices: list[Choice]) -> None:
        async def drain():
            async for i, item in fan.events():
                err = failure(item)
                if err is not None:
                    raise err
                choices[i].add(item)
        try:
            await until_disconnect(request, drain())
        finally:
            fan.close()

    def usage(prompts: list[list[int]], choices: list[Choice]) -> UsageInfo:
        p = sum(len(ids) for ids in prompts)
        c = sum(ch.num_output_tokens for ch in choices)
        return UsageInfo(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)

    # ------------------------------------------------------------------ /v1/completions

    def completion_prompts(req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        items = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
        if not items:
            raise ApiError(400, "prompt is empty", "prompt")
        out = []
        for item in items:
            if isinstance(item, str):
                if not item:
                    raise ApiError(400, "prompt is empty", "prompt")
                if tokenizer is None:
                    raise ApiError(400, "this model was loaded without a tokenizer; send the "
                                        "prompt as token ids", "prompt")
                try:
                    item = tokenizer.encode(item)
                except (TypeError, UnicodeError):  # a lone surrogate such as "\ud800"
                    raise ApiError(400, "prompt is not valid Unicode text", "prompt") from None
            check_ids(item, "prompt")
            out.append(list(item))
        return out

    @v1.post("/completions")
    async def create_completion(request: Request):
        arrival = time.perf_counter()
        req = parse(CompletionRequest, await read_json(request, max_body_bytes))
        check_common(req)
        prompts = completion_prompts(req)
        mts = [budget(len(ids), req.max_tokens, "max_tokens", DEFAULT_COMPLETION_TOKENS)
               for ids in prompts]
        rid = f"cmpl-{uuid.uuid4().hex}"
        jobs = jobs_for(rid, req, prompts, mts, req.logprobs, {})
        choices = [Choice(k, ids) for k, (_, ids, _) in enumerate(jobs)]
        fan = await open_fanout(request, jobs, arrival)
        want_ids, want_lp = req.return_token_ids, req.logprobs is not None

        def choice(c: Choice, text: str, lps: list, offset: int, ids: list[int], first: bool,
                   done: bool) -> CompletionChoice:
            return CompletionChoice(
                index=c.index, text=text,
                logprobs=render.completion_logprobs(lps, offset) if want_lp else None,
                finish_reason=c.finish_reason if done else None,
                stop_reason=c.stop_reason if done else None,
                token_ids=ids if want_ids else None,
                prompt_token_ids=c.prompt_ids if want_ids and first else None)

        if not req.stream:
            await collect(request, fan, choices)
            return CompletionResponse(
                id=rid, model=served_model_name, usage=usage(prompts, choices),
                choices=[choice(c, c.text, c.logprobs, 0, c.token_ids, True, True)
                         for c in choices]).model_dump()

        offsets = [0] * len(choices)  # text_offset of each choice's next token

        def chunk(c: Choice, d, first: bool) -> str:
            ch = choice(c, d.new_text, d.new_logprobs, offsets[c.index], d.new_token_ids,
                        first, d.finished)
            offsets[c.index] += sum(len(render.token(lp.token_id)) for lp in d.new_logprobs)
            return sse(CompletionResponse(id=rid, model=served_model_name, choices=[ch]))

        def tail() -> str:
            return sse(CompletionResponse(id=rid, model=served_model_name, choices=[],
                                          usage=usage(prompts, choices)))

        include_usage = req.stream_options is not None and req.stream_options.include_usage
        return SSEResponse(sse_events(fan, choices, want_lp, chunk,
                                      tail=tail if include_usage else None), fan.close)

    # ------------------------------------------------------------------ /v1/chat/completions

    def chat_prompt(req: ChatCompletionRequest) -> list[int]:
        if tokenizer is None:
            raise ApiError(400, "this model was loaded without a tokenizer; chat needs one",
                           "messages")
        if tokenizer.chat_template is None:
            raise ApiError(400, "this model has no chat template; start the server with "
                                "--chat-template FILE or use /v1/completions", "messages")
        messages = []
        for k, m in enumerate(req.messages):
            content = m.content
            if content is None and m.role != "assistant":
                raise ApiError(400, f"messages[{k}]: a {m.role} message needs content",
                               "messages")
            if isinstance(content, list):
                bad = next((p.type for p in content if p.type != "text"), None)
                if bad is not None:
                    raise ApiError(400, f"messages[{k}]: content parts of type {bad!r} are "
                                        f"not supported (text only)", "messages")
                if any(p.text is None for p in content):
                    raise ApiError(400, f"messages[{k}]: a text part needs text", "messages")
                content = "\n".join(p.text for p in content)
            msg = {"role": m.role, "content": content or ""}
            if m.name is not None:
                msg["name"] = m.name
            messages.append(msg)
        try:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=req.add_generation_prompt, tokenize=True)
        except (TemplateError, ValueError, TypeError) as e:
            raise ApiError(400, f"the chat template failed on these messages: {e}",
                           "messages") from None
        check_ids(ids, "messages")
        return ids

    @v1.post("/chat/completions")
    async def create_chat_completion(request: Request):
        arrival = time.perf_counter()
        req = parse(ChatCompletionRequest, await read_json(request, max_body_bytes))
        check_common(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        ids = chat_prompt(req)
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        mt = budget(len(ids), req.max_completion_tokens or req.max_tokens, name, None)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        jobs = jobs_for(rid, req, [ids], [mt], logprobs,
                        {"logprobs": "top_logprobs", "max_tokens": name})
        choices = [Choice(k, ids) for k in range(len(jobs))]
        fan = await open_fanout(request, jobs, arrival)
        want_ids, want_lp = req.return_token_ids, req.logprobs

        if not req.stream:
            await collect(request, fan, choices)
            return ChatCompletionResponse(
                id=rid, model=served_model_name, usage=usage([ids], choices),
                prompt_token_ids=ids if want_ids else None,
                choices=[ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                                    logprobs=render.chat_logprobs(c.logprobs) if want_lp
                                    else None,
                                    finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                                    token_ids=c.token_ids if want_ids else None)
                         for c in choices]).model_dump()

        def chunk(c: Choice, d, first: bool) -> str:
            ch = ChatChunkChoice(
                index=c.index, delta=DeltaMessage(content=d.new_text),
                logprobs=render.chat_logprobs(d.new_logprobs) if want_lp else None,
                finish_reason=d.finish_reason if d.finished else None,
                stop_reason=d.stop_reason if d.finished else None,
                token_ids=d.new_token_ids if want_ids else None)
            return sse(ChatCompletionChunk(id=rid, model=served_model_name, choices=[ch]))

        def tail() -> str:
            return sse(ChatCompletionChunk(id=rid, model=served_model_name, choices=[],
                                           usage=usage([ids], choices)))

        head = [sse(ChatCompletionChunk(  # the role comes first, as OpenAI sends it
            id=rid, model=served_model_name,
            choices=[ChatChunkChoice(index=c.index,
                                     delta=DeltaMessage(role="assistant", content=""))]))
            for c in choices]
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        return SSEResponse(sse_events(fan, choices, want_lp, chunk, head,
                                      tail if include_usage else None), fan.close)

    app.include_router(v1)
    return app

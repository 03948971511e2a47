"""From an HTTP body to checked engine jobs: the door every endpoint opens the same way.

Why this module exists: both generating endpoints read the body the same way (JSON only, a size
limit, strict UTF-8), validate it against the same pydantic models, refuse the same things (an
unknown model, ``stream_options`` without ``stream``, a prompt outside the vocabulary or the
context, a budget the context cannot hold) and fan a request out into one
``(request_id, prompt_ids, SamplingParams)`` job per choice the same way. Saying it once here
keeps the two endpoints from drifting, and keeps every refusal a 400 that names its field before
anything reaches the engine.

A refusal's ``param`` always comes from the check that refused it: from pydantic's error
location, from ``InvalidRequest.param`` (``check_prompt_ids``, ``SamplingParams``), or from the
check here; an endpoint may rename it to its own wire name (chat's ``logprobs`` is
``top_logprobs`` for ``SamplingParams``). No message is ever read to find it.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import Request
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from nanoserve.async_engine import Overloaded
from nanoserve.entrypoints.openai.context import ServingContext
from nanoserve.entrypoints.openai.errors import ApiError, ClientGone, as_api_error
from nanoserve.entrypoints.openai.protocol import UNSUPPORTED, unsupported_field
from nanoserve.sampling.params import SamplingParams
from nanoserve.structured.params import StructuredOutputsParams
from nanoserve.validation import InvalidRequest, check_prompt_ids

MAX_REQUESTS_PER_CALL = 256  # prompts x n in one HTTP request: beyond this, send several


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
    """``body`` as a ``cls``, or a 400 naming the first field at fault. A field ``cls`` does
    not do (its ``unsupported`` table, else the generating endpoints') is a 400 too."""
    bad = unsupported_field(body, getattr(cls, "unsupported", UNSUPPORTED))
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


def check_model(ctx: ServingContext, req) -> None:
    if req.model is not None and req.model != ctx.served_model_name:
        raise ApiError(404, f"the model {req.model!r} does not exist; this server "
                            f"serves {ctx.served_model_name!r}", "model")


def check_common(ctx: ServingContext, req) -> None:
    if ctx.state.draining:
        raise ApiError(503, "the server is shutting down")
    check_model(ctx, req)
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options")


async def open_request(request: Request, ctx: ServingContext, cls):
    """The door of a generating endpoint: ``(arrival, req)`` for a body that parses as ``cls``
    and passes the checks every endpoint makes. ``arrival`` is when the request came in."""
    arrival = time.perf_counter()
    req = parse(cls, await read_json(request, ctx.max_body_bytes))
    check_common(ctx, req)
    return arrival, req


def encode_text(tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """``text`` through the checkpoint's tokenizer; text JSON can carry but no tokenizer can
    read (a lone surrogate such as ``"\\ud800"``) is a 400 on ``prompt``."""
    try:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    except (TypeError, UnicodeError):
        raise ApiError(400, "prompt is not valid Unicode text", "prompt") from None


def check_ids(ctx: ServingContext, ids: list[int], param: str) -> None:
    """``check_prompt_ids`` (empty, outside the vocabulary, too long) as a 400 on ``param``."""
    try:
        check_prompt_ids(ids, ctx.vocab_size, ctx.max_model_len, param)
    except InvalidRequest as e:
        raise as_api_error(e) from None


def budget(ctx: ServingContext, n_prompt: int, asked: int | None, name: str,
           default: int | None) -> int | None:
    """The ``max_tokens`` to run with: ``asked`` if the context holds it, else a 400 on
    ``name``; unasked, ``default`` cut to the context (``None``: until the context is full)."""
    limit = ctx.max_model_len
    if asked is None:
        return None if default is None else min(default, limit - n_prompt)
    if n_prompt + asked > limit:
        raise ApiError(400, f"{name!r} is too large: {asked}. This model's maximum context "
                            f"length is {limit} tokens and your request has "
                            f"{n_prompt} input tokens ({asked} > {limit} - "
                            f"{n_prompt}).", name)
    return asked


def structured(req, forced: StructuredOutputsParams | None = None
               ) -> tuple[StructuredOutputsParams | None, str]:
    """The request's grammar, from OpenAI's ``response_format`` or vLLM's
    ``structured_outputs``, and the wire field it came from (a refusal names it). ``forced``
    is a forced tool call's grammar (``tools.plan_tools`` made it, and refused a request that
    also gave one of the other two): it comes from ``tools``."""
    if forced is not None:
        return forced, "tools"
    rf, so = req.response_format, req.structured_outputs
    if rf is not None and so is not None and rf.get("type") != "text":
        raise ApiError(400, "give response_format or structured_outputs, not both",
                       "response_format")
    try:
        if so is not None:
            return StructuredOutputsParams(**so), "structured_outputs"
        if rf is None or rf.get("type") == "text":
            return None, "response_format"
        if rf.get("type") == "json_object":
            return StructuredOutputsParams(json_object=True), "response_format"
        if rf.get("type") == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or "schema" not in js:
                raise ApiError(400, "response_format.json_schema needs a 'schema' object",
                               "response_format")
            return (StructuredOutputsParams(json=js["schema"], strict=bool(js.get("strict"))),
                    "response_format")
    except TypeError as e:  # an unknown key of structured_outputs
        raise ApiError(400, f"structured_outputs: {e}", "structured_outputs") from None
    except ValueError as e:
        err = as_api_error(e)
        err.param = "structured_outputs" if so is not None else "response_format"
        raise err from None
    raise ApiError(400, f"response_format type {rf.get('type')!r}: choose text, json_object or "
                        f"json_schema", "response_format")


def sampling(req, max_tokens: int | None, logprobs: int | None, seed: int | None,
             names: dict[str, str], defaults: dict | None = None,
             forced: StructuredOutputsParams | None = None) -> SamplingParams:
    """The request's ``SamplingParams``; a refusal names the wire field (``names`` maps
    ``SamplingParams``' names to the endpoint's where they differ). A field the request does
    not set takes ``defaults`` (the checkpoint's generation_config.json), then vLLM's.
    ``forced``: a forced tool call's grammar, see ``structured``."""
    kw = dict(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=seed,
              stop=req.stop, stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
              skip_special_tokens=req.skip_special_tokens, min_p=req.min_p,
              presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
              repetition_penalty=req.repetition_penalty, min_tokens=req.min_tokens,
              logprobs=logprobs, structured_outputs=structured(req, forced)[0],
              logit_bias=req.logit_bias, prompt_logprobs=req.prompt_logprobs)
    sent = {k: v for k, v in kw.items() if v is not None}  # None: the field was not sent
    base = {k: v for k, v in (defaults or {}).items() if k != "max_tokens"}  # budget()'s
    try:
        return SamplingParams(max_tokens=max_tokens, **{**base, **sent})
    except ValueError as e:
        err = as_api_error(e)
        err.param = names.get(err.param, err.param)
        raise err from None


async def compile_grammar(ctx: ServingContext, req,
                          forced: StructuredOutputsParams | None = None) -> None:
    """Compile the request's grammar, if it has one, on a worker thread: the event loop keeps
    streaming other requests' tokens and the engine thread keeps stepping meanwhile. Compiled
    once per distinct spec (the backend caches it); a bad spec is a 400 naming its field,
    before any request reaches the engine. ``forced``: see ``structured``."""
    spec, field = structured(req, forced)
    if spec is None:
        return
    try:
        await asyncio.to_thread(ctx.engine.check_grammar, spec)
    except ValueError as e:
        err = as_api_error(e)
        err.param = field
        raise err from None


def jobs_for(ctx: ServingContext, rid: str, req, prompts: list[list[int]],
             max_tokens: list[int | None], logprobs: int | None,
             names: dict[str, str], forced: StructuredOutputsParams | None = None) -> list:
    """One ``(request_id, prompt_ids, SamplingParams)`` per prompt and choice, all or none:
    a request that could never fit the queue is a 400, one that cannot fit now a 429.
    ``forced``: a forced tool call's grammar, see ``structured``."""
    jobs = []
    if len(prompts) * req.n > MAX_REQUESTS_PER_CALL:
        raise ApiError(400, f"{len(prompts)} prompts x n={req.n} is over the limit of "
                            f"{MAX_REQUESTS_PER_CALL} per request", "prompt")
    for p, (ids, mt) in enumerate(zip(prompts, max_tokens, strict=True)):
        for j in range(req.n):
            seed = None if req.seed is None else req.seed + j  # differ, yet replay
            if seed is not None and seed >= 2**64:
                seed -= 2**64  # torch takes seeds below 2**64
            sp = sampling(req, mt, logprobs, seed, names, ctx.sampling_defaults, forced)
            jobs.append((f"{rid}-{p * req.n + j}", ids, sp))
    engine = ctx.engine
    limit = getattr(engine, "max_waiting", None)
    if limit is not None and len(jobs) > max(limit, 1):  # could never fit: not a retry
        raise ApiError(400, f"{len(jobs)} sequences ({len(prompts)} prompt(s) x n={req.n}) "
                            f"are more than this server queues at once "
                            f"(max_waiting={limit}); retrying will not help", "n")
    if limit is not None and len(jobs) > 1 and engine.num_waiting + len(jobs) > limit:
        raise as_api_error(Overloaded(engine.num_waiting, limit))
    return jobs

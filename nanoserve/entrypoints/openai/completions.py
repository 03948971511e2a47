"""``POST /v1/completions``: OpenAI's legacy completions, text or token ids in, text out.

Why this module exists: the completions endpoint is what benchmarks and most tools built for
vLLM speak, and its prompt is the most permissive field of the API: a string, a list of strings,
a list of token ids, or a list of such lists. ``completion_prompts`` turns any of them into token
id lists (encoding text with the checkpoint's tokenizer, so its BOS rules apply) and refuses an
empty one, one without a tokenizer to read it, or one outside the vocabulary or the context.
Every prompt times ``n`` is one choice, indexed prompt-major as OpenAI does. With no
``max_tokens`` a choice gets vLLM's default of 16, cut to what the context leaves.

The completions logprobs shape is the legacy one: parallel lists, with ``text_offset`` counted
across a stream's chunks.

``echo`` (vLLM's behaviour): each choice's text starts with its prompt's text (a token-id
prompt's decoding, special tokens kept), in a stream in the choice's first chunk. With
``logprobs`` too, the prompt tokens' entries come first, the first token's logprob null; vLLM
gets them by asking the engine for ``prompt_logprobs = logprobs``, and so does this endpoint,
so such a choice also carries ``prompt_logprobs``. vLLM's ``prompt_logprobs`` extension puts
one list per choice (``Render.prompt_logprobs``); a stream cannot carry it (a 400, as vLLM).
Usage in a stream follows ``stream_options`` (``streaming.should_include_usage``).
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from nanoserve.entrypoints.openai.context import ServingContext, serving
from nanoserve.entrypoints.openai.errors import ApiError
from nanoserve.entrypoints.openai.fanout import Choice, collect, open_fanout, usage
from nanoserve.entrypoints.openai.parsing import (
    budget,
    check_ids,
    compile_grammar,
    encode_text,
    jobs_for,
    open_request,
)
from nanoserve.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from nanoserve.entrypoints.openai.streaming import (
    SSEResponse,
    should_include_usage,
    sse,
    sse_events,
)

DEFAULT_COMPLETION_TOKENS = 16  # vLLM's default max_tokens for /v1/completions

router = APIRouter()


def _prompt_items(req: CompletionRequest) -> list:
    p = req.prompt
    return [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)


def completion_prompts(ctx: ServingContext, req: CompletionRequest) -> list[list[int]]:
    """Every prompt of ``req`` as token ids, checked."""
    items = _prompt_items(req)
    if not items:
        raise ApiError(400, "prompt is empty", "prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise ApiError(400, "prompt is empty", "prompt")
            if ctx.tokenizer is None:
                raise ApiError(400, "this model was loaded without a tokenizer; send the "
                                    "prompt as token ids", "prompt")
            item = encode_text(ctx.tokenizer, item)
        check_ids(ctx, item, "prompt")
        out.append(list(item))
    return out


def echo_texts(ctx: ServingContext, req: CompletionRequest, prompts: list[list[int]]
               ) -> list[str]:
    """Each prompt's text for ``echo``: as sent, or a token-id prompt decoded (special tokens
    kept, as vLLM decodes it). Empty strings without ``echo``."""
    if not req.echo:
        return [""] * len(prompts)
    items = _prompt_items(req)
    if ctx.tokenizer is None and not all(isinstance(i, str) for i in items):
        raise ApiError(400, "echo of a token-id prompt needs the tokenizer, and this model was "
                            "loaded without one", "echo")
    return [item if isinstance(item, str) else
            ctx.tokenizer.decode(ids, skip_special_tokens=False)
            for item, ids in zip(items, prompts, strict=True)]


def echo_logprobs(c: Choice) -> list:
    """The echoed prompt's legacy logprob entries: a bare id for the first token (no logprob),
    then each prompt token's ``TokenLogprob``."""
    entries = c.prompt_logprobs or [None] * len(c.prompt_ids)
    return [t if e is None else e for t, e in zip(c.prompt_ids, entries, strict=True)]


@router.post("/completions")
async def create_completion(request: Request):
    ctx = serving(request)
    arrival, req = await open_request(request, ctx, CompletionRequest)
    prompts = completion_prompts(ctx, req)
    texts = echo_texts(ctx, req, prompts)
    stream_usage = should_include_usage(req)  # refuses prompt_logprobs in a stream
    default = ctx.sampling_defaults.get("max_tokens", DEFAULT_COMPLETION_TOKENS)
    mts = [budget(ctx, len(ids), req.max_tokens, "max_tokens", default)
           for ids in prompts]
    rid = f"cmpl-{uuid.uuid4().hex}"
    await compile_grammar(ctx, req)
    engine_req = req  # vLLM: echo with logprobs asks the engine for the prompt's logprobs
    if req.echo and req.logprobs is not None and req.prompt_logprobs is None:
        engine_req = req.model_copy(update={"prompt_logprobs": req.logprobs})
    jobs = jobs_for(ctx, rid, engine_req, prompts, mts, req.logprobs, {})
    choices = [Choice(k, ids) for k, (_, ids, _) in enumerate(jobs)]
    fan = await open_fanout(request, ctx.engine, ctx.metrics, jobs, arrival)
    want_ids, want_lp, k = req.return_token_ids, req.logprobs is not None, req.logprobs
    name, render = ctx.served_model_name, ctx.render

    def choice(c: Choice, text: str, lps: list, offset: int, ids: list[int], first: bool,
               done: bool, prompt_lp: bool = False) -> CompletionChoice:
        return CompletionChoice(
            index=c.index, text=text,
            logprobs=render.completion_logprobs(lps, offset, k) if want_lp else None,
            finish_reason=c.finish_reason if done else None,
            stop_reason=c.stop_reason if done else None,
            token_ids=ids if want_ids else None,
            prompt_logprobs=render.prompt_logprobs(c.prompt_logprobs) if prompt_lp else None,
            prompt_token_ids=c.prompt_ids if want_ids and first else None)

    if not req.stream:
        await collect(request, fan, choices)
        return CompletionResponse(
            id=rid, model=name, usage=usage(prompts, choices),
            choices=[choice(c, texts[c.index // req.n] + c.text,
                            (echo_logprobs(c) if req.echo else []) + c.logprobs, 0,
                            c.token_ids, True, True, True)
                     for c in choices]).model_dump()

    offsets = [0] * len(choices)  # text_offset of each choice's next token
    echoed: set[int] = set()  # choices whose prompt went out (in their first chunk)

    def chunk(c: Choice, d, first: bool) -> CompletionResponse:
        text, lps = d.new_text, d.new_logprobs
        if req.echo and c.index not in echoed:
            echoed.add(c.index)
            text, lps = texts[c.index // req.n] + text, echo_logprobs(c) + lps
        ch = choice(c, text, lps, offsets[c.index], d.new_token_ids, first, d.finished)
        if ch.logprobs is not None:
            offsets[c.index] += sum(len(t) for t in ch.logprobs.tokens)
        return CompletionResponse(id=rid, model=name, choices=[ch])

    def tail() -> str:
        return sse(CompletionResponse(id=rid, model=name, choices=[],
                                      usage=usage(prompts, choices)))

    return SSEResponse(sse_events(fan, choices, want_lp, chunk,
                                  tail=tail if stream_usage.include_usage else None,
                                  usage=stream_usage), fan.close)

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
from nanoserve.entrypoints.openai.streaming import SSEResponse, sse, sse_events

DEFAULT_COMPLETION_TOKENS = 16  # vLLM's default max_tokens for /v1/completions

router = APIRouter()


def completion_prompts(ctx: ServingContext, req: CompletionRequest) -> list[list[int]]:
    """Every prompt of ``req`` as token ids, checked."""
    p = req.prompt
    items = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
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


@router.post("/completions")
async def create_completion(request: Request):
    ctx = serving(request)
    arrival, req = await open_request(request, ctx, CompletionRequest)
    prompts = completion_prompts(ctx, req)
    default = ctx.sampling_defaults.get("max_tokens", DEFAULT_COMPLETION_TOKENS)
    mts = [budget(ctx, len(ids), req.max_tokens, "max_tokens", default)
           for ids in prompts]
    rid = f"cmpl-{uuid.uuid4().hex}"
    await compile_grammar(ctx, req)
    jobs = jobs_for(ctx, rid, req, prompts, mts, req.logprobs, {})
    choices = [Choice(k, ids) for k, (_, ids, _) in enumerate(jobs)]
    fan = await open_fanout(request, ctx.engine, ctx.metrics, jobs, arrival)
    want_ids, want_lp = req.return_token_ids, req.logprobs is not None
    name, render = ctx.served_model_name, ctx.render

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
            id=rid, model=name, usage=usage(prompts, choices),
            choices=[choice(c, c.text, c.logprobs, 0, c.token_ids, True, True)
                     for c in choices]).model_dump()

    offsets = [0] * len(choices)  # text_offset of each choice's next token

    def chunk(c: Choice, d, first: bool) -> str:
        ch = choice(c, d.new_text, d.new_logprobs, offsets[c.index], d.new_token_ids, first,
                    d.finished)
        offsets[c.index] += sum(len(render.token(lp.token_id)) for lp in d.new_logprobs)
        return sse(CompletionResponse(id=rid, model=name, choices=[ch]))

    def tail() -> str:
        return sse(CompletionResponse(id=rid, model=name, choices=[],
                                      usage=usage(prompts, choices)))

    include_usage = req.stream_options is not None and req.stream_options.include_usage
    return SSEResponse(sse_events(fan, choices, want_lp, chunk,
                                  tail=tail if include_usage else None), fan.close)

"""``POST /v1/chat/completions``: messages in, the assistant's reply out, whole or streamed.

Why this module exists: chat adds one step the completions endpoint does not have, and it is
the step where a model is most easily fed the wrong integers: the messages become one prompt
through the checkpoint's own jinja chat template (or the server's ``--chat-template``), exactly
as transformers renders it, with the template writing BOS itself. ``chat_ids`` is that step, and
``/tokenize``'s chat form shares it so the two can never disagree. Content may be a string or a
list of text parts (joined by newlines); any other part type is refused, as is a template that
fails on the messages.

Names follow OpenAI's chat API where it differs from completions: ``max_completion_tokens``
(or the older ``max_tokens``; unset means "until the context is full", as in vLLM),
``logprobs: true`` with ``top_logprobs: k``, and a stream whose first chunk carries the role.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from nanoserve.entrypoints.openai.chat_render import (  # noqa: F401 (chat_ids, chat_messages: re-exported)
    chat_ids,
    chat_messages,
    chat_prompt,
)
from nanoserve.entrypoints.openai.context import serving
from nanoserve.entrypoints.openai.errors import ApiError
from nanoserve.entrypoints.openai.fanout import Choice, collect, open_fanout, usage
from nanoserve.entrypoints.openai.parsing import budget, compile_grammar, jobs_for, open_request
from nanoserve.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaMessage,
)
from nanoserve.entrypoints.openai.streaming import (
    SSEResponse,
    should_include_usage,
    sse,
    sse_events,
)

router = APIRouter()


@router.post("/chat/completions")
async def create_chat_completion(request: Request):
    ctx = serving(request)
    arrival, req = await open_request(request, ctx, ChatCompletionRequest)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    ids = chat_prompt(ctx, req)
    stream_usage = should_include_usage(req)  # refuses prompt_logprobs in a stream
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    mt = budget(ctx, len(ids), req.max_completion_tokens or req.max_tokens, name,
                ctx.sampling_defaults.get("max_tokens"))  # unset: generation_config's, or all
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    await compile_grammar(ctx, req)
    jobs = jobs_for(ctx, rid, req, [ids], [mt], logprobs,
                    {"logprobs": "top_logprobs", "max_tokens": name})
    choices = [Choice(k, ids) for k in range(len(jobs))]
    fan = await open_fanout(request, ctx.engine, ctx.metrics, jobs, arrival)
    want_ids, want_lp = req.return_token_ids, req.logprobs
    model, render = ctx.served_model_name, ctx.render

    if not req.stream:
        await collect(request, fan, choices)
        return ChatCompletionResponse(
            id=rid, model=model, usage=usage([ids], choices),
            prompt_token_ids=ids if want_ids else None,
            prompt_logprobs=render.prompt_logprobs(choices[0].prompt_logprobs),
            choices=[ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                                logprobs=render.chat_logprobs(c.logprobs) if want_lp else None,
                                finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                                token_ids=c.token_ids if want_ids else None)
                     for c in choices]).model_dump()

    def chunk(c: Choice, d, first: bool) -> ChatCompletionChunk:
        ch = ChatChunkChoice(
            index=c.index, delta=DeltaMessage(content=d.new_text),
            logprobs=render.chat_logprobs(d.new_logprobs) if want_lp else None,
            finish_reason=d.finish_reason if d.finished else None,
            stop_reason=d.stop_reason if d.finished else None,
            token_ids=d.new_token_ids if want_ids else None)
        return ChatCompletionChunk(id=rid, model=model, choices=[ch])

    def tail() -> str:
        return sse(ChatCompletionChunk(id=rid, model=model, choices=[],
                                       usage=usage([ids], choices)))

    head = [ChatCompletionChunk(  # the role comes first, as OpenAI sends it
        id=rid, model=model,
        choices=[ChatChunkChoice(index=c.index,
                                 delta=DeltaMessage(role="assistant", content=""))])
        for c in choices]
    return SSEResponse(sse_events(fan, choices, want_lp, chunk, head,
                                  tail if stream_usage.include_usage else None, stream_usage),
                       fan.close)

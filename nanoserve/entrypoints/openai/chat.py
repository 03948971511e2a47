"""``POST /v1/chat/completions``: messages in, the assistant's reply out, whole or streamed.

Why this module exists: it is the one route that turns a conversation into engine requests
and their output back into OpenAI's chat shapes. The steps are each said elsewhere and run here
in order: ``chat_render.chat_prompt`` renders the messages, the tools and the template's kwargs
through the checkpoint's chat template (``/tokenize``'s chat form shares it, so the two never
disagree); ``tools.plan_tools`` checks ``tools`` and ``tool_choice`` and says which grammar (a
forced call's) and which parser the output needs; ``parsing`` makes the engine jobs; and
``chat_output.ChoiceOutput`` reads each choice's text back into ``reasoning``, ``content`` and
``tool_calls``, whole or as stream deltas.

Names follow OpenAI's chat API where it differs from completions: ``max_completion_tokens``
(or the older ``max_tokens``; unset means "until the context is full", as in vLLM),
``logprobs: true`` with ``top_logprobs: k``, and a stream whose first chunk carries the role.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from nanoserve.entrypoints.openai.chat_output import ChoiceOutput, finish_reason
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
from nanoserve.entrypoints.openai.tools import plan_tools

router = APIRouter()


@router.post("/chat/completions")
async def create_chat_completion(request: Request):
    ctx = serving(request)
    arrival, req = await open_request(request, ctx, ChatCompletionRequest)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    plan = await plan_tools(ctx, req)  # before the prompt: a bad tool is named as such
    ids = chat_prompt(ctx, req)
    stream_usage = should_include_usage(req)  # refuses prompt_logprobs in a stream
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    mt = budget(ctx, len(ids), req.max_completion_tokens or req.max_tokens, name,
                ctx.sampling_defaults.get("max_tokens"))  # unset: generation_config's, or all
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    await compile_grammar(ctx, req, plan.spec)
    jobs = jobs_for(ctx, rid, req, [ids], [mt], logprobs,
                    {"logprobs": "top_logprobs", "max_tokens": name}, plan.spec)
    choices = [Choice(k, ids) for k in range(len(jobs))]
    outs = [ChoiceOutput(plan, ctx.reasoning_parser) for _ in choices]  # one reader each
    fan = await open_fanout(request, ctx.engine, ctx.metrics, jobs, arrival)
    want_ids, want_lp = req.return_token_ids, req.logprobs
    model, render = ctx.served_model_name, ctx.render

    if not req.stream:
        await collect(request, fan, choices)
        messages = [out.message(c.text) for c, out in zip(choices, outs, strict=True)]
        return ChatCompletionResponse(
            id=rid, model=model, usage=usage([ids], choices),
            prompt_token_ids=ids if want_ids else None,
            prompt_logprobs=render.prompt_logprobs(choices[0].prompt_logprobs),
            choices=[ChatChoice(index=c.index, message=m,
                                logprobs=render.chat_logprobs(c.logprobs) if want_lp else None,
                                finish_reason=finish_reason(c.finish_reason, out.called),
                                stop_reason=c.stop_reason,
                                token_ids=c.token_ids if want_ids else None)
                     for c, m, out in zip(choices, messages, outs, strict=True)]).model_dump()

    def chunk(c: Choice, d, first: bool) -> str:
        """The events of one engine delta: what its text released through the choice's
        parsers (none, one or several deltas); its logprobs and token ids ride on the first,
        the finish reason on the last, the choice's usage so far on each when the stream
        promises it (``continuous_usage_stats``). A delta that released nothing and carries
        nothing sends nothing."""
        out = outs[c.index]
        deltas = out.delta(d.new_text, d.finished)
        carries = d.finished or (want_lp and d.new_logprobs) or (want_ids and d.new_token_ids)
        if not deltas and not carries:
            return ""
        events = []
        for k, delta in enumerate(deltas or [DeltaMessage(content="")]):
            last = k == max(len(deltas), 1) - 1
            ch = ChatChunkChoice(
                index=c.index, delta=delta,
                logprobs=render.chat_logprobs(d.new_logprobs) if want_lp and k == 0 else None,
                finish_reason=finish_reason(d.finish_reason, out.called)
                if d.finished and last else None,
                stop_reason=d.stop_reason if d.finished and last else None,
                token_ids=d.new_token_ids if want_ids and k == 0 else None)
            event = ChatCompletionChunk(id=rid, model=model, choices=[ch])
            if stream_usage.continuous:
                event.usage = c.usage()
            events.append(sse(event))
        return "".join(events)

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

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

from nanoserve.entrypoints.openai.context import ServingContext, serving
from nanoserve.entrypoints.openai.errors import ApiError
from nanoserve.entrypoints.openai.fanout import Choice, collect, open_fanout, usage
from nanoserve.entrypoints.openai.parsing import (
    budget,
    check_ids,
    compile_grammar,
    jobs_for,
    open_request,
)
from nanoserve.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    DeltaMessage,
)
from nanoserve.entrypoints.openai.streaming import (
    SSEResponse,
    should_include_usage,
    sse,
    sse_events,
)

router = APIRouter()


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    """The messages as the template reads them: ``{"role", "content"[, "name"]}``."""
    out = []
    for k, m in enumerate(messages):
        content = m.content
        if content is None and m.role != "assistant":
            raise ApiError(400, f"messages[{k}]: a {m.role} message needs content", "messages")
        if isinstance(content, list):
            bad = next((p.type for p in content if p.type != "text"), None)
            if bad is not None:
                raise ApiError(400, f"messages[{k}]: content parts of type {bad!r} are not "
                                    f"supported (text only)", "messages")
            if any(p.text is None for p in content):
                raise ApiError(400, f"messages[{k}]: a text part needs text", "messages")
            content = "\n".join(p.text for p in content)
        msg = {"role": m.role, "content": content or ""}
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


def chat_ids(ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool,
             add_special_tokens: bool = False) -> list[int]:
    """The token ids of ``messages`` through the chat template; ``add_special_tokens`` adds
    the tokenizer's own (BOS) on top of what the template writes, as vLLM's ``/tokenize``
    does. Not checked against the vocabulary or the context: ``chat_prompt`` does that."""
    tokenizer = ctx.tokenizer
    if tokenizer is None:
        raise ApiError(400, "this model was loaded without a tokenizer; chat needs one",
                       "messages")
    if tokenizer.chat_template is None:
        raise ApiError(400, "this model has no chat template; start the server with "
                            "--chat-template FILE or use /v1/completions", "messages")
    rendered = chat_messages(messages)
    try:
        if add_special_tokens:
            text = tokenizer.apply_chat_template(
                rendered, add_generation_prompt=add_generation_prompt, tokenize=False)
            return tokenizer.encode(text, add_special_tokens=True)
        return tokenizer.apply_chat_template(
            rendered, add_generation_prompt=add_generation_prompt, tokenize=True)
    except ValueError as e:  # the tokenizer says which: no parse, the template's own raise, ...
        raise ApiError(400, f"{e} (on these messages)", "messages") from None
    except (TypeError, UnicodeError):  # text JSON carries but no tokenizer reads (a surrogate)
        raise ApiError(400, "messages are not valid Unicode text", "messages") from None


def chat_prompt(ctx: ServingContext, req: ChatCompletionRequest) -> list[int]:
    ids = chat_ids(ctx, req.messages, req.add_generation_prompt)
    check_ids(ctx, ids, "messages")
    return ids


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

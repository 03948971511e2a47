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

Tools and reasoning (Days 79-80) are two steps around the engine: ``tools.plan_tools`` checks
``tools`` and ``tool_choice`` at the door and says which grammar (a forced call's) and which
parser the output needs; ``chat_output.ChoiceOutput`` reads each choice's text back into
``reasoning``, ``content`` and ``tool_calls``, whole or as stream deltas.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from nanoserve.entrypoints.openai.chat_output import ChoiceOutput, finish_reason
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
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    DeltaMessage,
)
from nanoserve.entrypoints.openai.streaming import SSEResponse, sse, sse_events
from nanoserve.entrypoints.openai.tools import plan_tools

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
    plan = await plan_tools(ctx, req)  # before the prompt: a bad tool is named as such
    ids = chat_prompt(ctx, req)
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
            choices=[ChatChoice(index=c.index, message=m,
                                logprobs=render.chat_logprobs(c.logprobs) if want_lp else None,
                                finish_reason=finish_reason(c.finish_reason, out.called),
                                stop_reason=c.stop_reason,
                                token_ids=c.token_ids if want_ids else None)
                     for c, m, out in zip(choices, messages, outs, strict=True)]).model_dump()

    def chunk(c: Choice, d, first: bool) -> str:
        """The events of one engine delta: what its text released through the choice's
        parsers (none, one or several deltas); its logprobs and token ids ride on the first,
        the finish reason on the last. A delta that released nothing and carries nothing
        sends nothing."""
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
            events.append(sse(ChatCompletionChunk(id=rid, model=model, choices=[ch])))
        return "".join(events)

    def tail() -> str:
        return sse(ChatCompletionChunk(id=rid, model=model, choices=[],
                                       usage=usage([ids], choices)))

    head = [sse(ChatCompletionChunk(  # the role comes first, as OpenAI sends it
        id=rid, model=model,
        choices=[ChatChunkChoice(index=c.index,
                                 delta=DeltaMessage(role="assistant", content=""))]))
        for c in choices]
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    return SSEResponse(sse_events(fan, choices, want_lp, chunk, head,
                                  tail if include_usage else None), fan.close)

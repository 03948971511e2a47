"""A chat history, the request's tools and its template variables, rendered into token ids.

Why this module exists: chat adds one step the completions endpoint does not have, and it is the
step where a model is most easily fed the wrong integers: the messages become one prompt through
the checkpoint's own jinja chat template (or the server's ``--chat-template``), exactly as
transformers renders it, with the template writing BOS itself. ``chat_ids`` is that step, and
``/tokenize``'s chat form shares it with ``/v1/chat/completions`` so the two can never disagree.

Tool calling makes the history richer than role and text, and templates read it in one agreed
shape (transformers' and vLLM's), which ``chat_messages`` produces:

- content may be a string or a list of text parts (joined by newlines); any other part type is
  refused. Only an assistant message may have null content (a message that only calls tools);
- an assistant's ``tool_calls`` reach the template as ``[{"id", "type": "function", "function":
  {"name", "arguments": dict}}]``: the arguments, a JSON string on the wire, are parsed first
  (as vLLM does) so a template can ``tojson`` them; an empty string is ``{}``, text that is not
  a JSON object is a 400 naming ``messages`` (newer vLLM quietly renders ``{}`` instead; a
  client that sent broken history should hear about it). An empty list is dropped, so the
  template takes its plain assistant path;
- a ``tool`` message carries its ``tool_call_id`` when it has one (a template that needs it,
  Mistral's, fails with a 400 without it; the others render it);
- an assistant's ``reasoning`` or ``reasoning_content`` reaches the template under both names
  (Qwen 3 reads ``reasoning_content``);
- fields a role cannot carry (``tool_calls`` or reasoning off an assistant, ``tool_call_id`` off
  a tool message) are a 400, rather than silently dropped as vLLM drops them.

The template also gets ``tools`` (the request's definitions in OpenAI's shape, ``{"type":
"function", "function": {...}}``, unset fields left out) and the request's
``chat_template_kwargs`` as extra variables (``enable_thinking``). A kwarg named like a variable
the renderer sets itself (``messages``, ``tools``, ``add_generation_prompt``, ...) is a 400
naming ``chat_template_kwargs``: vLLM lets some of them override the request's own fields, which
makes one request say two things.
"""

from __future__ import annotations

import json

from nanoserve.entrypoints.openai.context import ServingContext
from nanoserve.entrypoints.openai.errors import ApiError
from nanoserve.entrypoints.openai.parsing import check_ids
from nanoserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ToolCall,
    ToolDefinition,
)

# the variables the renderer (or jinja's environment) sets: a chat_template_kwargs key may not
# name one (chat_template and tokenize are the two vLLM refuses too)
RESERVED_TEMPLATE_VARS = frozenset({
    "messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
    "raise_exception", "strftime_now", "chat_template", "tokenize"})


def _content(k: int, m: ChatMessage) -> str:
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
    return content or ""


def _tool_call(k: int, j: int, call: ToolCall) -> dict:
    """One call as templates read it, its arguments a dict (``""`` is ``{}``, as in vLLM)."""
    where = f"messages[{k}].tool_calls[{j}].function.arguments"
    text = call.function.arguments
    try:
        arguments = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise ApiError(400, f"{where} is not valid JSON ({e.msg} at character {e.pos})",
                       "messages") from None
    if not isinstance(arguments, dict):
        raise ApiError(400, f"{where} must be a JSON object, not {type(arguments).__name__}",
                       "messages")
    return {"id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": arguments}}


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    """The messages as templates read them: ``{"role", "content"[, "name"][, "tool_calls"]
    [, "tool_call_id"][, "reasoning_content", "reasoning"]}``; a key is there only when the
    message has it, so a history without tools renders as it did before tools existed."""
    out = []
    for k, m in enumerate(messages):
        msg = {"role": m.role, "content": _content(k, m)}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls is not None and m.role != "assistant":
            raise ApiError(400, f"messages[{k}]: only an assistant message has tool_calls "
                                f"(this one is {m.role})", "messages")
        if m.tool_call_id is not None and m.role != "tool":
            raise ApiError(400, f"messages[{k}]: only a tool message has tool_call_id "
                                f"(this one is {m.role})", "messages")
        reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
        if reasoning is not None and m.role != "assistant":
            raise ApiError(400, f"messages[{k}]: only an assistant message has reasoning "
                                f"(this one is {m.role})", "messages")
        if m.tool_calls:
            msg["tool_calls"] = [_tool_call(k, j, c) for j, c in enumerate(m.tool_calls)]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if reasoning is not None:
            msg["reasoning_content"] = msg["reasoning"] = reasoning
        out.append(msg)
    return out


def template_vars(tools: list[ToolDefinition] | None,
                  template_kwargs: dict | None) -> dict:
    """What the template gets besides the messages: ``tools`` as dicts in OpenAI's shape (None
    when the request has none, as transformers passes it) and the request's extra variables."""
    extra = dict(template_kwargs or {})
    clash = sorted(RESERVED_TEMPLATE_VARS & extra.keys())
    if clash:
        raise ApiError(400, f"chat_template_kwargs: {', '.join(map(repr, clash))} "
                            f"{'is' if len(clash) == 1 else 'are'} set by the server (send "
                            f"tools and add_generation_prompt as the request's own fields)",
                       "chat_template_kwargs")
    dicts = None if tools is None else [t.model_dump(exclude_none=True) for t in tools]
    return {"tools": dicts, **extra}


def chat_ids(ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool,
             add_special_tokens: bool = False, tools: list[ToolDefinition] | None = None,
             template_kwargs: dict | None = None) -> list[int]:
    """The token ids of ``messages`` through the chat template, with ``tools`` and the extra
    ``template_kwargs``; ``add_special_tokens`` adds the tokenizer's own (BOS) on top of what
    the template writes, as vLLM's ``/tokenize`` does. Not checked against the vocabulary or
    the context: ``chat_prompt`` does that."""
    tokenizer = ctx.tokenizer
    if tokenizer is None:
        raise ApiError(400, "this model was loaded without a tokenizer; chat needs one",
                       "messages")
    if tokenizer.chat_template is None:
        raise ApiError(400, "this model has no chat template; start the server with "
                            "--chat-template FILE or use /v1/completions", "messages")
    rendered = chat_messages(messages)
    extra = template_vars(tools, template_kwargs)
    try:
        if add_special_tokens:
            text = tokenizer.apply_chat_template(
                rendered, add_generation_prompt=add_generation_prompt, tokenize=False, **extra)
            return tokenizer.encode(text, add_special_tokens=True)
        return tokenizer.apply_chat_template(
            rendered, add_generation_prompt=add_generation_prompt, tokenize=True, **extra)
    except ValueError as e:  # the tokenizer says which: no parse, the template's own raise, ...
        raise ApiError(400, f"{e} (on these messages)", "messages") from None
    except (TypeError, UnicodeError):  # text JSON carries but no tokenizer reads (a surrogate)
        raise ApiError(400, "messages are not valid Unicode text", "messages") from None


def chat_prompt(ctx: ServingContext, req: ChatCompletionRequest) -> list[int]:
    """The prompt ids of a chat request (its tools and chat_template_kwargs included), checked
    against the vocabulary and the context."""
    ids = chat_ids(ctx, req.messages, req.add_generation_prompt, tools=req.tools,
                   template_kwargs=req.chat_template_kwargs)
    check_ids(ctx, ids, "messages")
    return ids

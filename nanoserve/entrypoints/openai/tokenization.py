"""``POST /tokenize`` and ``POST /detokenize``: vLLM's tokenizer API, over this server's tokenizer.

Why this module exists: a client that counts tokens (a benchmark aligning its prompt lengths, a
chat front end trimming history to ``max_model_len``) should count them with the server's own
tokenizer, not a guess. vLLM serves these two routes beside the OpenAI API and its tools call
them; nanoserve answers them with the same shapes:

- ``{"prompt": str, "add_special_tokens": true}`` or the chat form ``{"messages": [...],
  "add_generation_prompt": true, "add_special_tokens": false}`` (with ``tools`` and
  ``chat_template_kwargs`` as on ``/v1/chat/completions``) -> ``{"count",
  "max_model_len", "tokens", "token_strs"}`` (``token_strs`` with ``return_token_strs``: the
  tokenizer's own token strings, such as ``"Ġthe"``). The chat form goes through ``chat_ids``,
  the very step ``/v1/chat/completions`` takes, so the counts always agree;
- ``{"tokens": [int]}`` -> ``{"prompt": str}``, the text of those ids, special tokens kept.

Neither route runs the engine, and neither refuses a prompt for being longer than the context
(that is what a client asks ``count`` and ``max_model_len`` for). Both take the API key, the
``model`` check (404) and OpenAI's error shape of the generating endpoints; without a tokenizer
(``--skip-tokenizer-init``) both are a 400.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from nanoserve.entrypoints.openai.chat_render import chat_ids
from nanoserve.entrypoints.openai.context import ServingContext, serving
from nanoserve.entrypoints.openai.errors import ApiError
from nanoserve.entrypoints.openai.parsing import check_model, encode_text, parse, read_json
from nanoserve.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)

router = APIRouter()


def need_tokenizer(ctx: ServingContext, param: str):
    if ctx.tokenizer is None:
        raise ApiError(400, "this model was loaded without a tokenizer "
                            "(--skip-tokenizer-init); it reads and writes token ids only", param)
    return ctx.tokenizer


@router.post("/tokenize")
async def tokenize(request: Request):
    ctx = serving(request)
    body = await read_json(request, ctx.max_body_bytes)
    chat = "messages" in body
    if chat and "prompt" in body:
        raise ApiError(400, "send either prompt or messages, not both", "messages")
    req = parse(TokenizeChatRequest if chat else TokenizeCompletionRequest, body)
    check_model(ctx, req)
    if chat:
        need_tokenizer(ctx, "messages")
        ids = chat_ids(ctx, req.messages, req.add_generation_prompt, req.add_special_tokens,
                       tools=req.tools, template_kwargs=req.chat_template_kwargs)
    else:
        ids = encode_text(need_tokenizer(ctx, "prompt"), req.prompt, req.add_special_tokens)
    strs = [ctx.tokenizer.tok.id_to_token(t) for t in ids] if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=ctx.max_model_len, tokens=ids,
                            token_strs=strs).model_dump()


@router.post("/detokenize")
async def detokenize(request: Request):
    ctx = serving(request)
    req = parse(DetokenizeRequest, await read_json(request, ctx.max_body_bytes))
    check_model(ctx, req)
    tokenizer = need_tokenizer(ctx, "tokens")
    bad = next((t for t in req.tokens if not 0 <= t < ctx.vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"tokens: token id {bad} is outside the vocabulary "
                            f"(vocab_size={ctx.vocab_size})", "tokens")
    text = tokenizer.decode(req.tokens, skip_special_tokens=False)
    return DetokenizeResponse(prompt=text).model_dump()

"""``Render``: the engine's ``TokenLogprob``s as OpenAI's two logprob shapes, and token strings.

Why this module exists: the engine hands out a sampled token id, its logprob and the top ``k``
(id, logprob) pairs; the client wants text. The completions API wants the legacy shape (parallel
lists ``tokens``, ``token_logprobs``, ``top_logprobs`` and ``text_offset``), chat wants one object
per token with its UTF-8 bytes. Both render a token the same way: the tokenizer's decoding of
that one id with special tokens kept, or ``token_id:N`` for an engine loaded without a
tokenizer. A logprob of ``-inf`` is not JSON, so every value is clamped at -9999.
"""

from __future__ import annotations

from nanoserve.entrypoints.openai.protocol import (
    ChatLogprob,
    ChatLogprobs,
    CompletionLogprobs,
    TopLogprob,
)


def _clamp(lp: float) -> float:
    return max(lp, -9999.0)  # -inf is not JSON


class Render:
    """Token strings and logprobs in both of OpenAI's shapes (``TokenLogprob`` in)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def token(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def completion_logprobs(self, lps: list, offset: int) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for lp in lps:
            s = self.token(lp.token_id)
            out.tokens.append(s)
            out.token_logprobs.append(_clamp(lp.logprob))
            out.top_logprobs.append({s: _clamp(lp.logprob),
                                     **{self.token(t): _clamp(v) for t, v in lp.top}})
            out.text_offset.append(offset)
            offset += len(s)
        return out

    def chat_logprobs(self, lps: list) -> ChatLogprobs:
        content = []
        for lp in lps:
            s = self.token(lp.token_id)
            top = [TopLogprob(token=(t := self.token(i)), logprob=_clamp(v),
                              bytes=list(t.encode()))
                   for i, v in lp.top]
            content.append(ChatLogprob(token=s, logprob=_clamp(lp.logprob),
                                       bytes=list(s.encode()), top_logprobs=top))
        return ChatLogprobs(content=content)

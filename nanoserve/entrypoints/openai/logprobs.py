"""``Render``: the engine's ``TokenLogprob``s as OpenAI's two logprob shapes, and token strings.

Why this module exists: the engine hands out a sampled token id, its logprob and the top ``k``
(id, logprob) pairs; the client wants text. The completions API wants the legacy shape (parallel
lists ``tokens``, ``token_logprobs``, ``top_logprobs`` and ``text_offset``), chat wants one object
per token with its UTF-8 bytes. Both render a token the same way: the tokenizer's decoding of
that one id with special tokens kept, or ``token_id:N`` for an engine loaded without a
tokenizer. A logprob of ``-inf`` is not JSON, so every value is clamped at -9999.

vLLM's ``prompt_logprobs`` have a third shape: per prompt position, None for the first token
(nothing precedes it), else ``{token id: {logprob, rank, decoded_token}}`` for the prompt token
and the top k there. Echoed prompt tokens in the legacy shape come before the output's, the
first with a null logprob and null top logprobs, as vLLM's ``_create_completion_logprobs``
writes them.
"""

from __future__ import annotations

from nanoserve.entrypoints.openai.protocol import (
    ChatLogprob,
    ChatLogprobs,
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
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

    def completion_logprobs(self, lps: list, offset: int, k: int | None = None
                            ) -> CompletionLogprobs:
        """``lps``: TokenLogprobs, or a bare token id for a token with no logprob (an echoed
        prompt's first); ``k`` caps each top list (echoed prompt entries may carry more)."""
        out = CompletionLogprobs()
        for lp in lps:
            s = self.token(lp if isinstance(lp, int) else lp.token_id)
            out.tokens.append(s)
            out.text_offset.append(offset)
            offset += len(s)
            if isinstance(lp, int):
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(_clamp(lp.logprob))
            out.top_logprobs.append({s: _clamp(lp.logprob),
                                     **{self.token(t): _clamp(v) for t, v in lp.top[:k]}})
        return out

    def prompt_logprobs(self, entries: list | None) -> PromptLogprobs | None:
        """The engine's ``[None, TokenLogprob, ...]`` in vLLM's shape (None stays None)."""
        if entries is None:
            return None
        out: PromptLogprobs = []
        for e in entries:
            if e is None:
                out.append(None)
                continue
            d = {e.token_id: PromptLogprob(logprob=_clamp(e.logprob), rank=e.rank,
                                           decoded_token=self.token(e.token_id))}
            for r, (t, v) in enumerate(e.top, start=1):  # the prompt token keeps its own
                d.setdefault(t, PromptLogprob(logprob=_clamp(v), rank=r,
                                              decoded_token=self.token(t)))
            out.append(d)
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

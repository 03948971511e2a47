"""The sampler: one row of logits per request in, one token id per request out.

Why this module exists: a batch mixes greedy rows with sampled ones, each with its own
``SamplingParams`` (``params.py``, checked at the door), and every row must draw exactly what it
would draw alone, so a seeded request repeats its text in any batch.

The order of operations follows vLLM. Logprobs are read off the raw model logits first (vLLM's
default "raw_logprobs"). Then ``logit_bias`` is added (vLLM applies it, a non-argmax-invariant
logits processor, before the penalties), and the penalties edit the result:
``repetition_penalty`` for every token seen in the prompt or the output (a positive logit is
divided by it, a negative one multiplied), ``frequency_penalty`` times each token's count in
the output, ``presence_penalty`` once per token present in the output; and while a request
is short of ``min_tokens`` its EOS and ``stop_token_ids`` are masked out. Then temperature,
top-k, top-p, min-p, and the draw. Temperature 0 (below 1e-5, as in vLLM) means greedy (argmax
of the penalised logits), with no randomness consumed. Top-p keeps the smallest set of tokens
whose probability reaches ``top_p``, *including* the token that crosses the threshold:

>>> import torch
>>> probs = torch.tensor([[0.5, 0.3, 0.2]])
>>> top_p_mask(probs, torch.tensor([0.6])).tolist()  # 0.5 < 0.6, so 0.3 is kept too
[[True, True, False]]

Min-p keeps the tokens at least ``min_p`` times as likely as the most likely one:

>>> min_p_mask(probs, torch.tensor([0.5])).tolist()  # 0.2 < 0.5 * 0.5
[[True, True, False]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nanoserve.cpu import csrc
from nanoserve.sampling.params import SamplingParams

if TYPE_CHECKING:
    from nanoserve.engine.request import Request


@dataclass(slots=True)
class TokenLogprob:
    """One sampled token's logprob (from the raw logits), its rank (1 = the most likely; ties
    count against it, as in vLLM) and the top ``logprobs`` (token id, logprob), descending."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


def top_k_mask(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """logits (B, V), k (B,) with 0 meaning off -> keep-mask (B, V) with exactly k per row
    (ties at the k-th value are broken by the sort, so never more than k survive)."""
    V = logits.shape[-1]
    k = torch.where(k <= 0, V, k.clamp(max=V))
    order = logits.argsort(dim=-1, descending=True)  # (B, V)
    ranks = torch.arange(V, device=logits.device).expand_as(order)
    return torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, ranks < k[:, None])


def top_p_mask(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """probs (B, V), p (B,) -> keep-mask: tokens whose preceding mass is still below p."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly ahead of each token
    keep_sorted = before < p[:, None]
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def min_p_mask(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """probs (B, V), min_p (B,) -> keep-mask: prob >= min_p * the row's largest prob. The
    probs need not be normalised: the test is a ratio, so masking zeros elsewhere is harmless."""
    return probs >= min_p[:, None] * probs.amax(dim=-1, keepdim=True)


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits (R, V) of sampled (non-greedy) rows -> the distribution each row draws from."""
    dev = logits.device
    x = logits / torch.tensor([sp.temperature for sp in params], device=dev)[:, None]
    k = torch.tensor([sp.top_k for sp in params], device=dev)
    x = x.masked_fill(~top_k_mask(x, k), float("-inf"))
    probs = x.softmax(dim=-1)
    p = torch.tensor([sp.top_p for sp in params], device=dev)
    if (p < 1).any():  # top_p = 1 is "off": a float32 cumsum can reach 1.0 before the tail
        keep = top_p_mask(probs, p) | (p[:, None] >= 1)
        probs = probs.masked_fill(~keep, 0.0)
    if any(sp.min_p > 0 for sp in params):  # the top token always survives top-k and top-p
        m = torch.tensor([sp.min_p for sp in params], device=dev, dtype=probs.dtype)
        probs = probs.masked_fill(~min_p_mask(probs, m), 0.0)
    return probs


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits (B, V) -> each row's first maximal index (B,), as ``argmax(dim=-1)`` gives it;
    through the C++ op (``csrc/argmax.cpp``, several times faster on a CPU) where it is loaded."""
    if (csrc.loaded() and logits.device.type == "cpu" and logits.dtype == torch.float32
            and logits.dim() == 2 and logits.is_contiguous() and logits.shape[1] > 0):
        out = torch.empty(logits.shape[0], dtype=torch.long)
        torch.ops.nanoserve.argmax_rows(out, logits)
        return out
    return logits.argmax(dim=-1)


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """logits (B, V) float32 -> token ids (B,). Greedy rows take the argmax."""
    out = greedy(logits)
    rows = [i for i, sp in enumerate(params) if not sp.greedy]
    if not rows:
        return out
    probs = filtered_probs(logits[rows], [params[i] for i in rows])  # (R, V)
    for j, i in enumerate(rows):
        out[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return out


def _bin_counts(histories: list[list[int]], V: int, device: torch.device) -> torch.Tensor:
    """histories (R lists of token ids) -> counts (R, V) int64: how often each token occurs.
    Rows are padded with the id V, which lands in a spare column that is then dropped."""
    width = max(map(len, histories), default=0)
    ids = torch.tensor([h + [V] * (width - len(h)) for h in histories], dtype=torch.long,
                       device=device).reshape(len(histories), width)  # (R, T)
    counts = torch.zeros(len(histories), V + 1, dtype=torch.long, device=device)
    return counts.scatter_add_(1, ids, torch.ones_like(ids))[:, :V]  # (R, V)


def apply_penalties(logits: torch.Tensor, prompts: list[list[int]], outputs: list[list[int]],
                    params: list[SamplingParams]) -> torch.Tensor:
    """logits (R, V) raw -> penalised logits (R, V), vLLM's repetition, frequency and presence
    penalties. Repetition counts the prompt and the output; the other two the output only."""
    R, V = logits.shape
    dev = logits.device
    out_counts = _bin_counts(outputs, V, dev)  # (R, V)
    seen_out = out_counts > 0
    seen = seen_out | (_bin_counts(prompts, V, dev) > 0)  # (R, V)
    col = dict(device=dev, dtype=logits.dtype)
    rep = torch.tensor([sp.repetition_penalty for sp in params], **col)[:, None]  # (R, 1)
    rep = torch.where(seen, rep, 1.0)  # (R, V)
    x = torch.where(logits > 0, logits / rep, logits * rep)
    freq = torch.tensor([sp.frequency_penalty for sp in params], **col)[:, None]
    pres = torch.tensor([sp.presence_penalty for sp in params], **col)[:, None]
    return x - freq * out_counts.to(logits.dtype) - pres * seen_out.to(logits.dtype)


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits (B, V) -> a copy with each row's ``logit_bias`` added (ids checked at the door
    against the vocabulary; a bias of -100 is a ban in all but name)."""
    rows, cols, vals = [], [], []
    for i, sp in enumerate(params):
        for t, b in (sp.logit_bias or {}).items():
            rows.append(i)
            cols.append(t)
            vals.append(b)
    x = logits.clone()
    x[rows, cols] += torch.tensor(vals, device=logits.device, dtype=logits.dtype)
    return x


def token_logprobs(raw: torch.Tensor, tokens: torch.Tensor, ks: list[int]) -> list[TokenLogprob]:
    """raw logits (R, V), sampled tokens (R,), top counts -> one TokenLogprob per row."""
    lp = torch.log_softmax(raw.float(), dim=-1)  # (R, V)
    own = lp.gather(1, tokens[:, None])  # (R, 1)
    ranks = (lp >= own).sum(dim=-1)  # (R,): 1 for the most likely token
    top_lp, top_ids = lp.topk(min(max(ks), lp.shape[-1]), dim=-1)  # (R, K), descending
    own, ranks = own[:, 0].tolist(), ranks.tolist()
    top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
    return [TokenLogprob(t, own[j], ranks[j], list(zip(top_ids[j][:k], top_lp[j][:k],
                                                       strict=True)))
            for j, (t, k) in enumerate(zip(tokens.tolist(), ks, strict=True))]


def banned_stops(request: Request, num_output: int, V: int) -> set[int]:
    """The ids ``request`` may not draw as output token ``num_output + 1``: its EOS and
    ``stop_token_ids`` while it is short of ``min_tokens``, else none."""
    if num_output >= request.min_tokens:
        return set()
    return {t for t in (*request.eos_token_ids, *request.stop_token_ids) if 0 <= t < V}


def process_logits(logits: torch.Tensor, params: list[SamplingParams],
                   prompts: list[list[int]], outputs: list[list[int]],
                   banned: list[set[int]], grammar: tuple[list[int], torch.Tensor] | None = None,
                   ) -> torch.Tensor:
    """Raw logits (B, V) -> the logits each row draws from, before temperature: each row's
    ``logit_bias`` added, the penalties over each row's own history (``prompts[b]``,
    ``outputs[b]``), ``banned[b]`` at -inf, then the grammar's masks,
    ``grammar = (rows, words)`` with ``words`` (len(rows), ceil(V / 32)).
    A row's history is explicit, so a verify step can hand in one row per speculative position
    (the output extended by the proposals before it). ``logits`` itself when nothing applies."""
    x = logits
    if any(sp.logit_bias for sp in params):
        x = apply_logit_bias(logits, params)
    pen = [i for i, sp in enumerate(params) if sp.penalised]
    if pen:
        x = x.clone() if x is logits else x
        x[pen] = apply_penalties(x[pen], [prompts[i] for i in pen],
                                 [outputs[i] for i in pen], [params[i] for i in pen])
    rows, cols = [], []  # (row, token) pairs to mask: stop ids of requests short of min_tokens
    for i, stops in enumerate(banned):
        rows += [i] * len(stops)
        cols += stops
    if rows:
        x = x.clone() if x is logits else x
        x[rows, cols] = float("-inf")
    if grammar is not None and grammar[0]:  # the mask last: nothing may bring a banned token back
        from nanoserve.structured.mask import apply_words

        x = apply_words(x, *grammar)
    return x


def sample_requests(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """logits (B, V) float32, one row per request -> one token id per request.

    Reads each request's ``params``, ``generator``, ``prompt_token_ids``, ``output_token_ids``,
    ``eos_token_ids``, ``stop_token_ids`` and ``min_tokens``; when ``params.logprobs`` is set,
    appends one TokenLogprob to ``request.logprobs``. With none of the penalty, min-p, min-tokens
    or logprobs fields in use this is ``sample`` exactly, drawing the same random numbers.
    """
    params = [r.params for r in requests]
    V = logits.shape[1]
    grammar = None
    constrained = [i for i, r in enumerate(requests) if getattr(r, "matcher", None) is not None]
    if constrained:
        from nanoserve.structured.mask import fill

        grammar = (constrained, fill([requests[i].matcher for i in constrained], V))
    x = process_logits(logits, params, [r.prompt_token_ids for r in requests],
                       [r.output_token_ids for r in requests],
                       [banned_stops(r, len(r.output_token_ids), V) for r in requests], grammar)
    tokens = sample(x, params, [r.generator for r in requests])  # (B,)
    lp_rows = [i for i, sp in enumerate(params) if sp.logprobs is not None]
    if lp_rows:
        entries = token_logprobs(logits[lp_rows], tokens[lp_rows],
                                 [params[i].logprobs for i in lp_rows])
        for i, e in zip(lp_rows, entries, strict=True):
            requests[i].logprobs.append(e)
    return tokens.tolist()

"""The verify step: decodes with proposals scored in one forward, then judged and rolled back.

Why this module exists: speculative decoding (Day 76) changes what one engine step is. A
decoding request with k proposals puts 1 + k tokens through the model (its last sampled token
and the proposals after it) and needs the logits at every one of them, not only at the last; the
rejection sampler (``nanoserve.spec_decode.rejection``) then keeps a prefix of the proposals and
adds one token of the target's own. The positions past what was kept were written to the cache
and are forgotten: the row's length and the request's ``num_computed_tokens`` go back to its
tokens less the newest, which, as after any decode, is sampled and not yet computed. Its blocks
stay, because the next verify step writes the same positions again.

Every row runs in one packed forward (Day 51's stream), prefill chunks beside the decodes when
the step is ``mixed`` (chunked prefill, Day 41), or after them in their own forward when not. A
stop token or stop string inside the accepted run ends the request there
(``Request.append_token``), and the tokens after it are never emitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nanoserve.engine import prompt_logprobs
from nanoserve.sampling.sampler import sample_requests
from nanoserve.spec_decode.rejection import verify

if TYPE_CHECKING:
    from nanoserve.engine.engine import Engine
    from nanoserve.engine.request import Request
    from nanoserve.engine.scheduler_output import SchedulerOutput


def verify_step(engine: Engine, out: SchedulerOutput) -> list[Request]:
    """``Engine.step`` when some decode carries proposals; returns who finished."""
    finished: list[Request] = []
    chunks = out.chunks
    if chunks and not out.mixed:  # two forwards: the prompts first, as a plain step runs them
        finished += engine._run([c.request for c in chunks],
                                [c.request.token_ids[c.start:c.start + c.n] for c in chunks],
                                True, [c.completes for c in chunks])
        chunks = []
    requests = [c.request for c in chunks] + out.decode
    tokens = ([c.request.token_ids[c.start:c.start + c.n] for c in chunks]
              + [[r.output_token_ids[-1], *r.spec_token_ids] for r in out.decode])
    starts, lens = [c.start for c in chunks], [c.n for c in chunks]
    scored = prompt_logprobs.plan(requests[:len(chunks)], starts, lens) if chunks else None
    want = (scored or [1] * len(chunks)) + [1 + len(r.spec_token_ids) for r in out.decode]
    for r in requests:
        engine.sync_blocks(r)
    logits = engine.score([r.slot for r in requests], tokens, want)  # (sum(want), V)
    if scored is not None:  # chunks that ask for prompt logprobs (each chunk's rows come first)
        prompt_logprobs.record(logits[:sum(scored)], requests[:len(chunks)], starts, lens, scored)
    ends = torch.tensor(want).cumsum(0).tolist()
    plain = [b for b, c in enumerate(chunks) if c.completes]
    plain += [len(chunks) + i for i, r in enumerate(out.decode) if not r.spec_token_ids]
    if plain:
        rows = torch.tensor([ends[b] - 1 for b in plain], device=logits.device)
        reqs = [requests[b] for b in plain]
        toks = sample_requests(logits[rows], reqs)
        finished += [r for r, t in zip(reqs, toks, strict=True) if r.append_token(t)]
    spec = [len(chunks) + i for i, r in enumerate(out.decode) if r.spec_token_ids]
    if spec:
        index = torch.cat([torch.arange(ends[b] - want[b], ends[b]) for b in spec])
        reqs = [requests[b] for b in spec]
        verdicts = verify(logits[index.to(logits.device)], reqs)
        for r, v in zip(reqs, verdicts, strict=True):
            engine.spec_stats.observe(len(r.spec_token_ids), v.num_accepted)
            if _emit(r, v):
                finished.append(r)
            r.spec_token_ids, r.spec_draft_probs = [], None
            r.num_computed_tokens = r.num_tokens - 1  # the newest token is not computed yet
            if not r.is_finished:
                engine.cache.truncate_row(r.slot, r.num_computed_tokens)
    return finished


def _emit(request: Request, verdict) -> bool:
    """Append the verdict's tokens (and their logprobs) until the request finishes."""
    for i, t in enumerate(verdict.tokens):
        if verdict.logprobs is not None:
            request.logprobs.append(verdict.logprobs[i])
        if request.append_token(t):
            return True
    return False

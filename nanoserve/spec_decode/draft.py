"""A draft model: a smaller checkpoint proposes, batched across requests, over its own paged KV.

Why this module exists: n-gram lookup only proposes what the text already repeated; a small model
of the same vocabulary proposes what the target would likely say anywhere. ``DraftModelProposer``
runs that model in the engine's own process, after every step, for every decoding request at
once: (1) one packed forward of each request's tokens the draft has not seen yet (after a verify
step one or two; on a request's first proposal its whole prompt and output, in chunks of at most
``CATCH_UP_TOKENS``), whose last logits give ``d1``; (2) ``k - 1`` decode forwards, batched
over the requests, each feeding the proposals just made, giving ``d2 .. dk``. Host work is per
row and step, never per token. The draft runs eagerly (no compiled decode, no recorded windows):
its forwards are a fraction of the target's.

Its KV is its own ``BatchedPagedKVCache`` with its own blocks, not rows of the target's pool:

- the draft writes K/V for positions ahead of the target's allocation (proposals are made at the
  end of a step, before the scheduler grows the target's blocks for them), so it cannot borrow
  the target's blocks;
- preemption, prefix caching and abort then need to know nothing about the draft: the
  scheduler's KV manager never sees its blocks;
- a draft is small, so every row reserves ``max_model_len`` tokens up front, and the draft needs
  no block manager at all. The shipped model as its own draft (4 layers, 4 KV heads of 32,
  float32: 4 KiB a token) costs 4 MiB a row at 1,024 tokens, 32 MiB for the default 8 rows; a
  SmolLM2-135M-sized draft (30 layers, 3 KV heads of 64, bf16: 22.5 KiB a token) costs 45 MiB a
  row at 2,048 tokens, 360 MiB for 8 rows (180 MiB a row at its full 8,192).

A row is keyed by request id (a target slot moves under compaction, an id does not), assigned on
a request's first proposal and given back when the request is no longer among those passed to
``propose`` (or by ``release``); there are ``max_num_seqs`` of them. Each row remembers how many
of its request's tokens it holds (``n``, all of them equal to the request's) and the proposals it
fed after them; the next call keeps the longest prefix of those that the target kept
(``truncate_row``) and feeds the rest of the request's tokens.

Greedy requests propose the draft's argmax and leave ``spec_draft_probs`` None (the greedy
rejection compares with the target's argmax only). A sampled request draws each proposal from
``q``, the draft's logits through the request's own temperature, top-k, top-p and min-p
(``filtered_probs``), with the request's generator, and ``spec_draft_probs`` holds those ``(k,
V)`` float32 rows: what Leviathan et al.'s rule needs is what was sampled from, and that is ``q``.
Penalties, ``min_tokens`` and grammars are not applied to the draft: the target's distribution
has them, so a proposal they forbid is rejected there, never emitted.

``write_truncated_draft`` makes a cheap draft out of a target: its first layers, its own
embeddings, norm and head (the benchmark and the book use it).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from nanoserve.attention.paged import BatchedPagedKVCache
from nanoserve.config import ModelConfig
from nanoserve.sampling.sampler import filtered_probs, greedy
from nanoserve.spec_decode.proposer import Proposer

if TYPE_CHECKING:
    from nanoserve.config.speculative import SpeculativeConfig
    from nanoserve.engine.request import Request

CATCH_UP_TOKENS = 2048  # the most tokens one catch-up forward packs (a long prompt is chunked)


@dataclass(slots=True)
class DraftRow:
    """One request's row of the draft's cache: its first ``n`` tokens, then ``fed``."""

    index: int  # the row in the draft's cache
    request: Request  # whose: an id reused by a new request starts over
    n: int = 0  # the request's first n tokens are in the row
    fed: list[int] = field(default_factory=list)  # the draft's own proposals after them


def check_draft(draft: ModelConfig, path: str, vocab_size: int, max_model_len: int) -> None:
    """Refuse a draft that cannot propose for this target, naming both numbers."""
    if draft.vocab_size != vocab_size:
        raise ValueError(f"speculative_config: the draft model {path} has vocab_size="
                         f"{draft.vocab_size}, the target's is {vocab_size}: a draft must "
                         f"share the target's vocabulary")
    if draft.max_position_embeddings < max_model_len:
        raise ValueError(f"speculative_config: the draft model {path} has "
                         f"max_position_embeddings={draft.max_position_embeddings}, below the "
                         f"target's max_model_len={max_model_len}")


class DraftModelProposer(Proposer):
    def __init__(self, config: SpeculativeConfig, model: torch.nn.Module, attention: str,
                 max_num_seqs: int, max_model_len: int, block_size: int,
                 catch_up_tokens: int = CATCH_UP_TOKENS):
        super().__init__(config)
        self.model = model
        self.device = model.embed_tokens.weight.device
        self.max_model_len = max_model_len
        self.catch_up_tokens = catch_up_tokens
        per_row = -(-max_model_len // block_size)
        self.cache = BatchedPagedKVCache.for_model(model, max_num_seqs * per_row, block_size,
                                                   max_num_seqs, max_model_len, attention)
        for i, table in enumerate(self.cache.tables):  # each row owns its blocks for good
            table.extend(list(range(i * per_row, (i + 1) * per_row)))
        self.rows: dict[object, DraftRow] = {}  # request id -> its row
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))  # popped from the end
        self.forward_passes = 0  # the draft's forwards, for the tests and the book

    @classmethod
    def create(cls, config: SpeculativeConfig, loaded) -> DraftModelProposer:
        """Load ``config.model`` as the target was loaded (``LoadedEngine.load_like``: dtype,
        device, packing, C++ ops), after checking its vocabulary and length against the
        target's."""
        path = str(config.model)
        check_draft(ModelConfig.from_dir(path), path, loaded.model_config.vocab_size,
                    loaded.max_model_len)
        model, attention = loaded.load_like(path)
        c = loaded.config
        return cls(config, model, attention, c.max_num_seqs, loaded.max_model_len,
                   c.block_size, c.max_num_batched_tokens or CATCH_UP_TOKENS)

    def describe(self) -> str:
        cfg = self.model.cfg
        return (f"draft_model {self.config.model} ({self.model.num_parameters() / 1e6:.2f}M "
                f"params, {cfg.num_hidden_layers} layers), {self.k} tokens a step; its own KV: "
                f"{len(self.cache.tables)} rows of {self.max_model_len} tokens, "
                f"{self.cache.nbytes() / 2**20:.1f} MiB")

    # ------------------------------------------------------------------ rows

    @property
    def num_rows_held(self) -> int:
        return len(self.rows)

    def release(self, request: Request) -> None:
        self._free(request.request_id)

    def _free(self, request_id) -> None:
        row = self.rows.pop(request_id, None)
        if row is not None:
            self.cache.truncate_row(row.index, 0)
            self.free_rows.append(row.index)

    def _row(self, request: Request) -> DraftRow:
        row = self.rows.get(request.request_id)
        if row is not None and row.request is not request:  # the id came back: a new request
            self._free(request.request_id)
            row = None
        if row is None:
            if not self.free_rows:
                raise RuntimeError(f"the draft's {len(self.cache.tables)} rows are all held: "
                                   f"more running requests than max_num_seqs")
            row = self.rows[request.request_id] = DraftRow(self.free_rows.pop(), request)
        return row

    def _rollback(self, row: DraftRow, request: Request) -> list[int]:
        """Cut the row to the longest prefix that is still the request's (its own proposals
        the target did not keep are forgotten); return the request's tokens past it, at
        least one (the newest, whose logits propose ``d1``)."""
        tail = _tokens_from(request, row.n)  # the request's tokens past the verified prefix
        m = 0
        while m < len(row.fed) and m < len(tail) and row.fed[m] == tail[m]:
            m += 1
        keep = min(row.n + m, request.num_tokens - 1)
        if keep < self.cache.lengths[row.index]:
            self.cache.truncate_row(row.index, keep)
        row.n, row.fed = request.num_tokens, []
        return _tokens_from(request, keep)

    # ------------------------------------------------------------------ proposing

    @torch.inference_mode()
    def propose(self, requests: list[Request]) -> None:
        live = {r.request_id for r in requests}
        for rid in [rid for rid in self.rows if rid not in live]:  # finished, preempted, gone
            self._free(rid)
        todo: list[tuple[Request, DraftRow, int]] = []  # (request, its row, proposals wanted)
        feeds: list[list[int]] = []
        for r in requests:
            r.spec_token_ids, r.spec_draft_probs = [], None
            k = min(self.k, self.max_model_len - r.num_tokens,
                    r.max_tokens - len(r.output_token_ids) - 1)
            if k > 0:  # else nothing can be verified: its row catches up next time
                row = self._row(r)
                todo.append((r, row, k))
                feeds.append(self._rollback(row, r))
        if not todo:
            return
        reqs = [r for r, _, _ in todo]
        logits = self._catch_up([row.index for _, row, _ in todo], feeds)  # (B, V)
        tokens, probs = self._draw(logits, reqs)
        proposals = [[t] for t in tokens]  # per request, d1..dj so far
        dists = [[p] for p in probs]  # per request, q1..qj (None for greedy)
        for j in range(1, self.k):
            live_b = [b for b, (_, _, k) in enumerate(todo) if k > j]
            if not live_b:
                break
            feed = [proposals[b][-1] for b in live_b]
            for b, t in zip(live_b, feed, strict=True):
                todo[b][1].fed.append(t)
            logits = self._decode([todo[b][1].index for b in live_b], feed)  # (B', V)
            tokens, probs = self._draw(logits, [reqs[b] for b in live_b])
            for b, t, p in zip(live_b, tokens, probs, strict=True):
                proposals[b].append(t)
                dists[b].append(p)
        for r, props, qs in zip(reqs, proposals, dists, strict=True):
            r.spec_token_ids = props
            r.spec_draft_probs = None if qs[0] is None else torch.stack(qs)  # (k, V)

    def _draw(self, logits: torch.Tensor, requests: list[Request]
              ) -> tuple[list[int], list[torch.Tensor | None]]:
        """logits (B, V) -> a proposal per request, and the q row it was drawn from (None for
        a greedy request: its argmax)."""
        tokens = greedy(logits.contiguous())  # (B,)
        probs: list[torch.Tensor | None] = [None] * len(requests)
        sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
        if sampled:
            q = filtered_probs(logits[sampled], [requests[i].params for i in sampled])  # (R, V)
            q = (q / q.sum(dim=-1, keepdim=True)).float()  # what is drawn from, normalised
            for j, i in enumerate(sampled):
                tokens[i] = torch.multinomial(q[j], 1, generator=requests[i].generator)[0]
                probs[i] = q[j]
        return tokens.tolist(), probs

    # ------------------------------------------------------------------ forwards

    def _catch_up(self, rows: list[int], token_lists: list[list[int]]) -> torch.Tensor:
        """Append token_lists[b] to row rows[b] in packed forwards of at most
        ``catch_up_tokens`` tokens (a long list is split across forwards); each row's
        last-token logits (B, V)."""
        out: list[torch.Tensor | None] = [None] * len(rows)
        b, at = 0, 0  # the next row, and how far into its tokens
        while b < len(rows):
            batch, toks, done, ends = [], [], [], []  # this forward's rows, tokens, who ends
            left = self.catch_up_tokens
            while b < len(rows) and left > 0:
                take = min(len(token_lists[b]) - at, left)
                batch.append(rows[b])
                toks.append(token_lists[b][at:at + take])
                left -= take
                at += take
                if at == len(token_lists[b]):
                    done.append(len(batch) - 1)
                    ends.append(b)
                    b, at = b + 1, 0
            if done:
                logits = self._forward_packed(batch, toks, done)  # (len(done), V)
                for i, row_logits in zip(ends, logits, strict=True):
                    out[i] = row_logits
            else:  # one long row's middle chunk: its K/V only
                self._forward_packed(batch, toks, [])
        return torch.stack(out)

    def _forward_packed(self, rows: list[int], token_lists: list[list[int]],
                        want: list[int]) -> torch.Tensor:
        """One packed forward; the last-token logits of the rows at indices ``want``."""
        lens = [len(t) for t in token_lists]
        starts = [self.cache.lengths[r] for r in rows]
        ids = torch.tensor([t for toks in token_lists for t in toks])[None]  # (1, N)
        pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
        self.cache.begin_step(rows, lens, packed=True)
        try:
            h = self.model(ids.to(self.device), pos[None].to(self.device), self.cache)
        finally:
            self.cache.end_step()
        self.forward_passes += 1
        if not want:
            return h[0, :0]  # nothing asked: no head
        ends = torch.tensor(lens).cumsum(0) - 1  # (B,) each row's last token in the stream
        return self.model.compute_logits(h[0, ends[want].to(self.device)])  # (len(want), V)

    def _decode(self, rows: list[int], tokens: list[int]) -> torch.Tensor:
        """One token appended to each row; (B, V) logits."""
        ids = torch.tensor(tokens)[:, None]  # (B, 1)
        pos = torch.tensor([[self.cache.lengths[r]] for r in rows])  # (B, 1)
        self.cache.begin_step(rows, [1] * len(rows))
        try:
            h = self.model(ids.to(self.device), pos.to(self.device), self.cache)  # (B, 1, E)
        finally:
            self.cache.end_step()
        self.forward_passes += 1
        return self.model.compute_logits(h[:, 0])  # (B, V)


def _tokens_from(request: Request, start: int) -> list[int]:
    """``request.token_ids[start:]`` without building the whole list."""
    p = len(request.prompt_token_ids)
    if start >= p:
        return request.output_token_ids[start - p:]
    return request.prompt_token_ids[start:] + request.output_token_ids


def write_truncated_draft(src: str | Path, dst: str | Path, num_layers: int) -> Path:
    """A draft made of a checkpoint's first ``num_layers`` layers, with its own embeddings,
    final norm and head (and its tokenizer files): the cheapest draft a target has, exact in
    vocabulary and positions. Writes ``dst`` (config.json with ``num_hidden_layers`` changed,
    one model.safetensors) and returns it."""
    from safetensors.torch import save_file

    from nanoserve.model.weights import load_hf_state_dict

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"num_layers={num_layers}: {src} has {config['num_hidden_layers']} "
                         f"layers")
    dst.mkdir(parents=True, exist_ok=True)
    keep = {}
    for name, t in load_hf_state_dict(src).items():
        parts = name.split(".")
        if "layers" in parts and int(parts[parts.index("layers") + 1]) >= num_layers:
            continue
        keep[name] = t.contiguous()
    save_file(keep, dst / "model.safetensors", metadata={"format": "pt"})
    config["num_hidden_layers"] = num_layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:num_layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in src.iterdir():  # the tokenizer and generation defaults travel along
        if f.is_file() and f.name != "config.json" and not f.name.startswith("model"):
            shutil.copy(f, dst / f.name)
    return dst

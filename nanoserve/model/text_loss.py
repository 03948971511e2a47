"""The shipped model's text and a model's loss over it: one definition for training, the book
and quantization's quality checks.

Why this module exists: nanoserve-tiny (``tools/train_tiny.py``) is trained on
``pydoc_data.topics`` with every 10th topic by name held out, and its validation loss is the mean
next-token loss over non-overlapping windows of the held-out stream. ``nanoserve quantize``
measures a quantized model's perplexity the same way on the same split, so the split and the
measurement live here, where the training script, the book and ``nanoserve.quantize`` all import
them, rather than in a script the package cannot import.

    train_docs, val_docs = corpus()
    stream = encode_stream(tok, val_docs)        # BOS doc EOS BOS doc EOS ...
    loss = evaluate(model, stream, seq_len=256)  # perplexity = exp(loss)
"""

from __future__ import annotations

from pydoc_data.topics import topics

import torch
import torch.nn.functional as F


def corpus() -> tuple[list[str], list[str]]:
    """Topics sorted by name; every 10th one is held out for validation."""
    docs = [topics[n].strip() + "\n" for n in sorted(topics)]
    return ([d for i, d in enumerate(docs) if i % 10 != 3],
            [d for i, d in enumerate(docs) if i % 10 == 3])


def encode_stream(tok, docs: list[str]) -> torch.Tensor:
    """All documents as one token stream: BOS doc EOS BOS doc EOS ... (``tok`` a
    ``tokenizers.Tokenizer`` whose post-processor adds BOS; EOS is id 1, nanoserve-tiny's)."""
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids + [1])
    return torch.tensor(ids, dtype=torch.long)


def loss_of(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of ``model`` reading x (B, T) against targets y (B, T)."""
    pos = torch.arange(x.shape[1])[None].expand_as(x)
    logits = model.compute_logits(model(x, pos))  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq_len: int, batch: int = 8) -> float:
    """Mean loss over every non-overlapping window of ``stream`` (the tail shorter than a window
    is left out), ``batch`` windows a forward."""
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise ValueError(f"a stream of {len(stream)} tokens holds no window of {seq_len} "
                         f"tokens and its next")
    x = stream[: n * seq_len].view(n, seq_len)
    y = stream[1: n * seq_len + 1].view(n, seq_len)
    losses = [loss_of(model, x[i:i + batch], y[i:i + batch]).item() * len(x[i:i + batch])
              for i in range(0, n, batch)]
    return sum(losses) / n

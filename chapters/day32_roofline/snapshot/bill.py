"""A decode step's bill, counted from the tensors a model allocates.

The roofline's arithmetic (``nanoserve.bench.roofline.StepCost``) works from the config: so many
layers, so many heads, each projection's shape written out by hand. This counts the same two
numbers a second way, from a model built on the meta device (every tensor with its real shape
and dtype, no memory): the bytes of every parameter, and two FLOPs per weight of every linear
a row goes through, the LM head included. If the formula forgot a projection, the two disagree.
"""

from __future__ import annotations

from torch import nn


def step_bill(model: nn.Module) -> dict[str, int]:
    """``params`` and ``weight_bytes``: every parameter once (a tied head shares the
    embedding's tensor, so it is counted once); ``flops_per_row``: two per weight of every
    ``nn.Linear``, and of the embedding where it doubles as the LM head (``lm_head is None``)."""
    params = {id(p): p for p in model.parameters()}.values()
    linears = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    if getattr(model, "lm_head", None) is None:
        linears.append(model.embed_tokens.weight)  # the tied head: logits = h @ embedding.T
    return {"params": sum(p.numel() for p in params),
            "weight_bytes": sum(p.numel() * p.element_size() for p in params),
            "flops_per_row": sum(2 * w.numel() for w in linears)}

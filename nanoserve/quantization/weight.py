"""``QuantizedWeight``: one linear layer's quantized weight in the form every format is read into.

Why this module exists: compressed-tensors, GPTQ and AWQ store the same numbers in three packings
(which dimension the int32 words run along, whether zero points are offset by one, in which order
the nibbles sit). Unpacked, they all say the same thing, per output feature ``n`` and input ``k``::

    W[n, k] = (q[n, k] - zero[n, g]) * scale[n, g]        g = k // group_size

with ``q`` a signed integer of ``bits`` bits and ``zero`` absent (0) for a symmetric scheme. This
form is what the loader checks (``check``), what tensor parallelism cuts (``narrow``), what a
fused qkv or gate_up concatenates (``cat``), and what a kernel repacks once at load. ``q`` is held
one value per byte here, unpacked; a kernel's copy packs two int4 values to a byte.

GPTQ's act-order checkpoints (``desc_act``) give each input column a group out of order
(``g_idx``); the reader sorts the columns so that groups are contiguous and keeps the order in
``perm``: column ``j`` of ``q`` multiplies input ``perm[j]``, so a kernel reads ``x[..., perm]``.

    qw = QuantizedWeight(q, scale, zero=None, bits=4, group_size=32)
    w = qw.dequantize(torch.float32)                     # (N, K), in the input's order
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

BITS = (4, 8)  # the weight widths a kernel and a format here take


@dataclass(frozen=True)
class QuantizedWeight:
    q: torch.Tensor  # (N, K) int8, signed: in [-2**(bits-1), 2**(bits-1) - 1]
    scale: torch.Tensor  # (N, G) floating point, G = K // group_size
    zero: torch.Tensor | None  # (N, G) int8 in q's range; None for a symmetric scheme
    bits: int
    group_size: int  # K for one scale per output feature ("channel")
    perm: torch.Tensor | None = None  # (K,) int64: q's column j multiplies input perm[j]
    act_bits: int | None = None  # 8: activations quantized per token at run time (W8A8)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def groups(self) -> int:
        return self.scale.shape[1]

    @property
    def symmetric(self) -> bool:
        return self.zero is None

    def check(self, name: str) -> QuantizedWeight:
        """Refuse, naming ``name`` and the shapes, anything that cannot be this layer's weight;
        returns itself so a reader can write ``QuantizedWeight(...).check(name)``."""
        if self.bits not in BITS:
            raise ValueError(f"{name}: {self.bits}-bit weights; supported: {BITS}")
        if self.q.dim() != 2 or self.q.dtype != torch.int8:
            raise ValueError(f"{name}: the unpacked weight must be (N, K) int8, got "
                             f"{tuple(self.q.shape)} {self.q.dtype}")
        N, K = self.q.shape
        if self.group_size < 1 or K % self.group_size:
            raise ValueError(f"{name}: group_size {self.group_size} does not divide the "
                             f"{K} inputs of weight {tuple(self.q.shape)}")
        G = K // self.group_size
        if tuple(self.scale.shape) != (N, G) or not self.scale.is_floating_point():
            raise ValueError(f"{name}: weight_scale has shape {tuple(self.scale.shape)} "
                             f"{self.scale.dtype}; a ({N}, {K}) weight in groups of "
                             f"{self.group_size} needs a floating ({N}, {G})")
        if self.zero is not None and (tuple(self.zero.shape) != (N, G)
                                      or self.zero.dtype != torch.int8):
            raise ValueError(f"{name}: weight_zero_point has shape {tuple(self.zero.shape)} "
                             f"{self.zero.dtype}; a ({N}, {K}) weight in groups of "
                             f"{self.group_size} needs an int8 ({N}, {G})")
        lo, hi = -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        for what, t in (("weight", self.q), ("weight_zero_point", self.zero)):
            if t is not None and t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
                raise ValueError(f"{name}: {what} holds values outside [{lo}, {hi}] for "
                                 f"{self.bits}-bit weights")
        if self.perm is not None and tuple(self.perm.shape) != (K,):
            raise ValueError(f"{name}: g_idx gives {tuple(self.perm.shape)} columns for a "
                             f"weight of {K} inputs")
        if self.act_bits not in (None, 8):
            raise ValueError(f"{name}: {self.act_bits}-bit activations; supported: 8")
        return self

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The (N, K) weight these numbers stand for, in ``dtype``, columns in the input's
        order: the reference every kernel is checked against."""
        q = self.q.to(torch.float32).unflatten(1, (self.groups, self.group_size))  # (N, G, gs)
        if self.zero is not None:
            q = q - self.zero.to(torch.float32)[..., None]
        w = (q * self.scale.to(torch.float32)[..., None]).flatten(1)  # (N, K)
        if self.perm is not None:
            w = torch.empty_like(w).index_copy_(1, self.perm, w)
        return w.to(dtype)

    def narrow(self, dim: int, start: int, length: int) -> QuantizedWeight:
        """Output features (``dim=0``) or inputs (``dim=1``) ``[start, start + length)``: what
        tensor parallelism keeps on one rank. Inputs are cut on group boundaries only."""
        if dim == 0:
            cut = lambda t: None if t is None else t.narrow(0, start, length)  # noqa: E731
            return replace(self, q=cut(self.q), scale=cut(self.scale), zero=cut(self.zero))
        if dim != 1:
            raise ValueError(f"a weight has dims 0 and 1, not {dim}")
        if self.perm is not None:
            raise ValueError("an act-order (desc_act) weight's inputs cannot be split across "
                             "ranks: its groups are not contiguous in the input")
        if start % self.group_size or length % self.group_size:
            raise ValueError(f"inputs [{start}, {start + length}) do not fall on groups of "
                             f"{self.group_size}")
        g0, gn = start // self.group_size, length // self.group_size
        return replace(self, q=self.q.narrow(1, start, length),
                       scale=self.scale.narrow(1, g0, gn),
                       zero=None if self.zero is None else self.zero.narrow(1, g0, gn))

    @staticmethod
    def cat(parts: list[QuantizedWeight], name: str = "fused weight") -> QuantizedWeight:
        """Parts stacked along the output features (q, k and v; gate and up): they must share
        bits, groups, symmetry and input order."""
        first = parts[0]
        for p in parts[1:]:
            same = (p.bits, p.group_size, p.symmetric, p.act_bits, p.q.shape[1]) == (
                first.bits, first.group_size, first.symmetric, first.act_bits, first.q.shape[1])
            if not same:
                raise ValueError(f"{name}: its parts are quantized differently ({p.bits} vs "
                                 f"{first.bits} bits, groups {p.group_size} vs "
                                 f"{first.group_size}) and cannot be fused")
            if (p.perm is None) != (first.perm is None) or (
                    p.perm is not None and not torch.equal(p.perm, first.perm)):
                raise ValueError(f"{name}: its parts read one input in different act orders "
                                 f"(g_idx) and cannot be fused")
        zero = None if first.zero is None else torch.cat([p.zero for p in parts])
        return replace(first, q=torch.cat([p.q for p in parts]),
                       scale=torch.cat([p.scale for p in parts]), zero=zero)

    def to(self, device: torch.device | str | None = None,
           scale_dtype: torch.dtype | None = None) -> QuantizedWeight:
        """On ``device``, with scales in ``scale_dtype`` (the integers keep theirs)."""
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(self, q=mv(self.q), zero=mv(self.zero), perm=mv(self.perm),
                       scale=self.scale.to(device=device, dtype=scale_dtype))

    def nbytes(self, scale_bytes: int | None = None) -> int:
        """Bytes a kernel streams for this weight: ``bits`` per value, plus each group's scale
        (``scale_bytes`` each, default the scale's own dtype) and zero point (one ``bits``-wide
        value each). What a decode step reads, and what Day 75's byte ceiling divides."""
        N, K = self.shape
        per_scale = self.scale.element_size() if scale_bytes is None else scale_bytes
        zeros = 0 if self.zero is None else N * self.groups * self.bits / 8
        return int(N * K * self.bits / 8 + N * self.groups * per_scale + zeros)

"""A ``Recipe``: which scheme, which method, which groups; what ``nanoserve quantize`` was asked.

Why this module exists: the command's flags combine in ways that are not all meaningful (W8A8 is
per-channel and symmetric; GPTQ needs calibration; a group size must be at least 1), and the
calibration loop, the writer and the quality checks all need the same answers: the bits, the
group size, and whether a given linear can be quantized at all. One frozen object holds them and
refuses a bad combination when it is made, before a model is loaded.

    r = Recipe("w4a16", method="gptq", group_size=32)
    qw = r.quantize(w, H)               # w (N, K), H (K, K) or None for RTN
    r.skips(688)                        # True: 32 does not divide 688 inputs; left dense
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from nanoserve.quantization.compressed_tensors_write import scheme
from nanoserve.quantization.gptq import gptq
from nanoserve.quantization.rtn import quantize_rtn
from nanoserve.quantization.weight import QuantizedWeight

METHODS = ("rtn", "gptq")
DEFAULT_GROUP_SIZE = 128  # weight-only schemes; W8A8 is per channel


@dataclass(frozen=True)
class Recipe:
    scheme: str  # w8a16, w4a16, w8a8
    method: str = "rtn"
    group_size: int | None = DEFAULT_GROUP_SIZE  # None: one scale per output feature
    symmetric: bool = True
    damp: float = 0.01  # GPTQ's diagonal damping, a fraction of the Hessian's mean diagonal
    block_size: int = 128  # GPTQ's lazy-batch width
    scale_dtype: torch.dtype = torch.bfloat16  # scales as stored (and rounded against)

    def __post_init__(self):
        scheme(self.scheme)  # refuses an unknown name
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r}; choose one of {METHODS}")
        if self.group_size is not None and self.group_size < 1:
            raise ValueError(f"group_size {self.group_size}: a group holds at least 1 input")
        if self.act_bits is not None and (self.group_size is not None or not self.symmetric):
            raise ValueError(f"{self.scheme}: weights are symmetric with one scale per output "
                             f"feature (group_size {self.group_size}, symmetric "
                             f"{self.symmetric} asked)")
        if not 0 <= self.damp:
            raise ValueError(f"damp {self.damp} must be >= 0")

    @classmethod
    def of(cls, scheme_name: str, group_size: int | None | str = "default", **kw) -> Recipe:
        """The recipe with ``group_size`` defaulted per scheme (128; per channel for W8A8);
        ``"channel"`` is None, one scale per output feature."""
        if group_size == "channel":
            group_size = None
        if group_size == "default":
            group_size = None if scheme(scheme_name)[1] is not None else DEFAULT_GROUP_SIZE
        return cls(scheme_name, group_size=group_size, **kw)

    @property
    def bits(self) -> int:
        return scheme(self.scheme)[0]

    @property
    def act_bits(self) -> int | None:
        return scheme(self.scheme)[1]

    @property
    def needs_calibration(self) -> bool:
        return self.method == "gptq"

    def with_method(self, method: str) -> Recipe:
        return replace(self, method=method)

    def skips(self, in_features: int) -> bool:
        """Whether a linear of ``in_features`` inputs stays dense: the group size does not
        divide them (nanoserve-tiny's down_proj has 688 = 16 * 43 inputs: 32 and 128 do not)."""
        return self.group_size is not None and in_features % self.group_size != 0

    def quantize(self, w: torch.Tensor, H: torch.Tensor | None = None) -> QuantizedWeight:
        """``w`` (N, K) by this recipe; ``H`` (K, K), the Hessian of its inputs, for GPTQ."""
        if self.method == "gptq":
            if H is None:
                raise ValueError("gptq needs the Hessian of the layer's inputs (calibration)")
            qw = gptq(w, H, self.bits, self.group_size, self.symmetric, self.damp,
                      self.block_size, self.scale_dtype)
        else:
            qw = quantize_rtn(w, self.bits, self.group_size, self.symmetric, self.scale_dtype)
        if self.act_bits is not None:
            qw = replace(qw, act_bits=self.act_bits).check("w8a8 weight")
        return qw

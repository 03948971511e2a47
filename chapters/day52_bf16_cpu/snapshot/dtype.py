"""Day 52 snapshot (frozen): what ``dtype="auto"`` means, read from the processor's flags.

On a card, "auto" is the checkpoint's own dtype. On a CPU it depends on the processor: where it
has a native bf16 dot product (AMX tiles, or the AVX512-BF16 instructions) bf16 matmuls run at
two to three times float32's rate and bfloat16 is the right default; where bf16 would be
emulated it is slower than float32, so float32 it is. The choice comes with a sentence that
says why, for the log. Only the weights, activations and KV cache change dtype: the logits are
cast to float32 before the sampler sees them.

    >>> resolve_dtype("auto", flags={"avx512f", "avx512_bf16"})
    torch.bfloat16
    >>> resolve_dtype("auto", flags={"avx2", "avx512f"})
    torch.float32
    >>> reason("auto", flags={"amx_bf16", "amx_tile"})
    'this CPU multiplies bf16 natively (amx_bf16)'
"""

from __future__ import annotations

import torch

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of a native bf16 matmul
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first ``flags`` line of /proc/cpuinfo (or of the text given), as a set."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16(flags: set[str], capability: str | None = None) -> str | None:
    """The flag that makes bf16 matmuls native, else None. With no flags at all (no
    /proc/cpuinfo), torch's dispatch level stands in: "AMX" in ``capability``."""
    for flag in BF16_CPU_FLAGS:
        if flag in flags:
            return flag
    if not flags:
        cap = torch.backends.cpu.get_cpu_capability() if capability is None else capability
        if "AMX" in cap:
            return "amx (torch cpu capability)"
    return None


def resolve_dtype(dtype: str, flags: set[str] | None = None, device: str = "cpu",
                  checkpoint_dtype: str = "float32") -> torch.dtype:
    """A user's dtype as a torch dtype; "auto" follows the device and, on a CPU, its flags."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not supported")
        return DTYPES[dtype]
    if torch.device(device).type != "cpu":
        return DTYPES.get(checkpoint_dtype, torch.float32)
    flags = cpu_flags() if flags is None else flags
    return torch.bfloat16 if native_bf16(flags) else torch.float32


def reason(dtype: str, flags: set[str] | None = None, device: str = "cpu") -> str:
    """Why ``resolve_dtype`` chose what it chose, in one clause for the log line."""
    if dtype != "auto":
        return "as asked"
    if torch.device(device).type != "cpu":
        return "the checkpoint's dtype"
    flag = native_bf16(cpu_flags() if flags is None else flags)
    return (f"this CPU multiplies bf16 natively ({flag})" if flag else
            "no native bf16 matmul on this CPU (no amx_bf16 / avx512_bf16 flag)")

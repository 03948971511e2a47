"""The C++ CPU ops: built once per machine, loaded into ``torch.ops.nanoserve``.

Why this package exists: on a CPU, a decode step of a small model spends about half its time
outside the matmuls, in dozens of small PyTorch ops per layer (casts, the norm's reductions,
RoPE's slices and cats, the attention gather), each a dispatch and a pass over memory. The ops
here do each of those jobs in one pass (``norm.cpp``, ``activation.cpp``, ``rope_cache.cpp``,
``decode_attention.cpp``), written with ATen's ``at::vec`` so that one source compiles to
AVX-512 or AVX2, whichever the compiler is told the CPU has.

The build uses ``torch.utils.cpp_extension`` (ninja and the system's g++) with ``-march=native``,
so it is cached per CPU model, torch version and source hash under the repository's
``build/csrc/`` (``NANOSERVE_BUILD_DIR`` moves it). ``make setup`` builds it; otherwise the first
``load()`` does, and reports how long it took. Where it cannot be built, ``load()`` returns the
reason, a warning says it once, and the engine runs its PyTorch path (``llm.kernels_reason``).

    reason = load()          # None once torch.ops.nanoserve.* exist
    build_seconds()          # the build's wall time in this process, 0.0 when it was cached
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SOURCES = ("registry.cpp", "norm.cpp", "activation.cpp", "rope_cache.cpp", "decode_attention.cpp",
           "small_gemm.cpp", "threads.cpp", "token_bitmask.cpp", "argmax.cpp",
           "decode_layers.cpp", "decode_layers_quant.cpp", "quant_gemm.cpp", "quant_dequant.cpp",
           "int8_gemm.cpp")
HEADERS = ("ops.h", "vec.h", "small_gemm_avx2.h", "quant_gemm_avx512.h", "quant_gemm_avx2.h",
           "quant_common.h", "decode_layers.h")
# -ffp-contract=off: no multiply-add fused behind our back, so float32 rounds where PyTorch does.
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-std=c++17")

_state: dict = {"reason": "not loaded yet", "loaded": False, "build_s": 0.0, "warned": False}


def cpu_model() -> str:
    """The processor's model name: the build is -march=native, so it is only valid on it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_signature() -> str:
    """The model name plus what tells two processors of one name apart: a VM may call a Zen 3
    and a Zen 5 both "AMD EPYC", and a -march=native build or a timed verdict from one is not
    valid on the other (the build could die of an illegal instruction). Family, model, stepping
    and a hash of the feature flags, as /proc/cpuinfo gives them; the name alone elsewhere."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            key = key.strip()
            if not sep:
                break  # the first processor's block ends at a blank line
            if key in ("cpu family", "model", "stepping", "flags"):
                fields.setdefault(key, value.strip())
    except OSError:
        pass
    if not fields:
        return cpu_model()
    flags = hashlib.sha256(fields.get("flags", "").encode()).hexdigest()[:8]
    return (f"{cpu_model()} (family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')} stepping {fields.get('stepping', '?')}, flags {flags})")


def build_key() -> str:
    """What the cached library depends on: sources, flags, torch, the CPU."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode())
        h.update((HERE / name).read_bytes())
    h.update(" ".join(CFLAGS).encode())
    h.update(torch.__version__.encode())
    h.update(cpu_signature().encode())
    return h.hexdigest()[:12]


def build_dir() -> Path:
    root = os.environ.get("NANOSERVE_BUILD_DIR")
    if root:
        return Path(root) / "csrc"
    repo = HERE.parents[2]
    if (repo / "pyproject.toml").exists():  # a checkout (editable install): its build/
        return repo / "build" / "csrc"
    return Path.home() / ".cache" / "nanoserve" / "csrc"


def _build() -> None:
    from torch.utils import cpp_extension

    venv_bin = str(Path(sys.executable).parent)  # pip's ninja, when the venv is not activated
    if venv_bin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    name = f"nanoserve_ops_{build_key()}"
    where = build_dir() / name
    where.mkdir(parents=True, exist_ok=True)
    lib = where / f"{name}.so"
    if lib.exists():  # built before on this CPU, from these sources
        torch.ops.load_library(str(lib))
        return
    t0 = time.perf_counter()
    cpp_extension.load(name=name, sources=[str(HERE / s) for s in SOURCES],
                       extra_cflags=list(CFLAGS), extra_ldflags=["-fopenmp"],
                       build_directory=str(where), is_python_module=False, verbose=False)
    _state["build_s"] = time.perf_counter() - t0


def load() -> str | None:
    """Make ``torch.ops.nanoserve`` available; None when it is, else why not (warned once)."""
    if _state["loaded"]:
        return None
    if os.environ.get("NANOSERVE_NO_KERNELS"):
        _state["reason"] = "NANOSERVE_NO_KERNELS is set"
    else:
        try:
            _build()
            from nanoserve.cpu.csrc.fakes import register_fakes

            register_fakes()  # what torch.compile needs to trace the ops
            _state["loaded"], _state["reason"] = True, None
            return None
        except Exception as exc:  # no compiler, no ninja, a failed build: say so and go on
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            _state["reason"] = f"the C++ ops did not build: {type(exc).__name__}: {first}"
    if not _state["warned"]:
        _state["warned"] = True
        warnings.warn(f"nanoserve's C++ CPU ops are unavailable ({_state['reason']}); "
                      f"running the PyTorch path", RuntimeWarning, stacklevel=2)
    return _state["reason"]


def resolve(kernels: bool | str, device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    """(use the ops?, why): ``auto`` uses them on a CPU in float32 or bf16 where they load;
    ``True`` uses them or raises a ValueError saying why not; ``False`` never."""
    if kernels not in ("auto", True, False):
        raise ValueError(f"kernels={kernels!r}; choose 'auto', True or False")
    if kernels is False:
        return False, "kernels=False"
    why_not = None
    if device.type != "cpu":
        why_not = f"the C++ ops are a CPU path (device is {device.type})"
    elif dtype not in (torch.float32, torch.bfloat16):
        why_not = f"the C++ ops take float32 or bfloat16, not {dtype}"
    else:
        why_not = load()
    if why_not:
        if kernels is True:
            raise ValueError(f"kernels=True: {why_not}")
        return False, why_not
    took = build_seconds()
    built = f"built in {took:.1f} s" if took else "cached build"
    return True, f"C++ CPU ops loaded ({built}, {build_dir() / ('nanoserve_ops_' + build_key())})"


def loaded() -> bool:
    """Whether ``torch.ops.nanoserve`` is loaded in this process (never builds or loads it)."""
    return _state["loaded"]


def build_seconds() -> float:
    """Wall time this process spent building the library (0.0 when it came from the cache)."""
    return _state["build_s"]


def main() -> int:
    """``python -m nanoserve.cpu.csrc``: build (or find) the library and say how long it took."""
    t0 = time.perf_counter()
    reason = load()
    if reason:
        print(f"nanoserve C++ ops: not built: {reason}")
        return 1
    took = build_seconds()
    how = f"built in {took:.1f} s" if took else "cached"
    print(f"nanoserve C++ ops: {how} "
          f"({build_dir()}, key {build_key()}, {cpu_model()}); "
          f"load {time.perf_counter() - t0:.2f} s")
    return 0

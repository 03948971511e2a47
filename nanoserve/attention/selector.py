"""Choosing the attention backend: the one place that reads the ``attention`` option.

Why this module exists: a backend is chosen once, at load, and everything after holds the
chosen object. Here the option becomes a class: ``auto`` is resolved (the C++ kernel where the
ops are on, else Day 50's gathered mapping), the name is looked up in the registry
(``nanoserve.config.registries``), and the class is held against what the model needs
(``AttentionSpec``): a backend that cannot serve the model is a ``ValueError`` naming what it
lacks. ``workspace_bytes`` prices each read path's intermediates through the same registry.

>>> backend_class("gathered").name
'gathered'
>>> workspace_bytes("reference", [4, 4], 2, 1, 8, 4)  # 64 + 512 + 8 + 64
648
"""

from __future__ import annotations

from nanoserve.attention.backends.base import AttentionBackend, AttentionSpec
from nanoserve.config.registries import ATTENTION_BACKENDS, load_class


def backend_class(name: str) -> type[AttentionBackend]:
    """The class registered under ``name``; an unknown name is refused with the known ones."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention={name!r}; choose one of {tuple(ATTENTION_BACKENDS)}")
    return load_class(ATTENTION_BACKENDS[name])


def resolve(option: str, kernels: bool) -> str:
    """The backend an ``attention`` option names: ``auto`` is the C++ kernel where the ops
    are on (``kernels``), else the gathered mapping."""
    if option != "auto":
        return option
    return "cpu" if kernels else "gathered"


def prepare_process(option: str) -> None:
    """What the named backend must settle before the model is built (``auto`` never needs
    anything: it resolves to a CPU path)."""
    if option != "auto":
        backend_class(option).prepare_process()


def choose(option: str, kernels: bool, spec: AttentionSpec) -> str:
    """The backend that will read this model's cache: ``option`` resolved, then held against
    ``spec``; a backend that cannot serve it is refused naming what it lacks."""
    name = resolve(option, kernels)
    why = backend_class(name).unsupported(spec)
    if why:
        raise ValueError(f"attention={name!r} cannot serve this model: it does not support "
                         f"{why}")
    return name


def workspace_bytes(path: str, context_lens: list[int], num_q_heads: int, num_kv_heads: int,
                    head_dim: int, dtype_bytes: int, chunk: int = 32,
                    block_size: int = 16) -> int:
    """Bytes of the intermediate tensors one layer's decode read materialises (one query a row)
    on read path ``path``: each backend prices its own (``AttentionBackend.workspace_bytes``)."""
    return backend_class(path).workspace_bytes(context_lens, num_q_heads, num_kv_heads,
                                               head_dim, dtype_bytes, chunk, block_size)

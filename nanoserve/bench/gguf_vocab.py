"""A GGUF vocabulary from a checkpoint's ``tokenizer.json``, so that llama.cpp will load it.

Why this module exists: llama.cpp refuses a model file without a vocabulary, even when, as in
the benchmarks, every prompt is given as token ids and nothing is ever tokenized. A byte-level
BPE ``tokenizer.json`` (GPT-2's scheme, which the shipped model and the Llama family use) maps
onto GGUF's ``gpt2`` tokenizer directly: the tokens in id order, a type per token (``CONTROL``
for the added special tokens, ``NORMAL`` for the rest), the merges as ``"left right"`` strings,
and the BOS and EOS ids. A vocabulary shorter than the model's ``vocab_size`` is padded with
``UNUSED`` tokens, as Hugging Face pads its embedding.

A checkpoint with no ``tokenizer.json`` (the random shape checkpoints of ``shapes.py``) gets a
stand-in: the special token at the BOS/EOS ids, one merged token (``ĠĠ``: llama.cpp wants at
least one merge), the 256 byte-level characters, then padding.
It loads and can spell any text byte by byte; it is not the published model's vocabulary, which
only matters for text, never for the token ids a benchmark feeds.

    vocab = gguf_vocab(checkpoint_dir, config)   # -> GGUFVocab(tokens, types, merges, ...)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# GGUF's token types (gguf.TokenType): the values llama.cpp reads
NORMAL, CONTROL, UNUSED = 1, 3, 5


@dataclass(frozen=True)
class GGUFVocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: int | None
    eos: int | None
    pre: str  # llama.cpp's pre-tokenizer name ("gpt-2", or "default")
    source: str  # where it came from, for the report


def byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: byte b as one printable character, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def _ids(config: dict, key: str) -> int | None:
    v = config.get(key)
    if isinstance(v, list):
        v = v[0] if v else None
    return v


def _pad(tokens: list[str], types: list[int], vocab_size: int) -> None:
    if len(tokens) > vocab_size:
        raise ValueError(f"tokenizer.json holds {len(tokens)} tokens; the model's vocab_size "
                         f"is {vocab_size}")
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)


def _from_tokenizer_json(path: Path, config: dict) -> GGUFVocab:
    tok = json.loads(path.read_text())
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"{path}: model.type {model.get('type')!r}; the GGUF writer turns "
                         f"byte-level BPE (gpt2-style) tokenizers only")
    by_id = {int(i): t for t, i in model["vocab"].items()}
    special = set()
    for added in tok.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
        if added.get("special"):
            special.add(int(added["id"]))
    n = max(by_id) + 1
    missing = [i for i in range(n) if i not in by_id]
    if missing:
        raise ValueError(f"{path}: token ids {missing[:5]} have no token")
    tokens = [by_id[i] for i in range(n)]
    types = [CONTROL if i in special else NORMAL for i in range(n)]
    _pad(tokens, types, config["vocab_size"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pre = tok.get("pre_tokenizer") or {}
    gpt2 = pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
    return GGUFVocab(tokens, types, merges, _ids(config, "bos_token_id"),
                     _ids(config, "eos_token_id"), "gpt-2" if gpt2 else "default", str(path))


def _stand_in(config: dict) -> GGUFVocab:
    bos, eos = _ids(config, "bos_token_id"), _ids(config, "eos_token_id")
    specials = sorted({i for i in (bos, eos) if i is not None})
    tokens, types = [], []
    chars = iter(["ĠĠ", *byte_chars()])  # one merge first: llama.cpp needs the key
    for i in range(max(len(specials) + 257, specials[-1] + 1 if specials else 0)):
        if i in specials:
            tokens.append("<|endoftext|>" if len(specials) == 1 else f"<|special_{i}|>")
            types.append(CONTROL)
        else:
            t = next(chars, None)
            tokens.append(f"[PAD{i}]" if t is None else t)
            types.append(UNUSED if t is None else NORMAL)
    n = config["vocab_size"]  # a small test model keeps only the first bytes
    tokens, types = tokens[:n], types[:n]
    _pad(tokens, types, n)
    return GGUFVocab(tokens, types, ["Ġ Ġ"], bos, eos, "gpt-2",
                     "stand-in (no tokenizer.json): byte-level characters and padding")


def gguf_vocab(checkpoint: Path, config: dict) -> GGUFVocab:
    """The checkpoint's vocabulary for GGUF (the module docstring says which and why)."""
    path = Path(checkpoint) / "tokenizer.json"
    return _from_tokenizer_json(path, config) if path.is_file() else _stand_in(config)


def add_vocab(writer, vocab: GGUFVocab) -> None:
    """The ``tokenizer.ggml.*`` keys of a GGUF file, on a ``gguf.GGUFWriter``."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    if vocab.bos is not None:
        writer.add_bos_token_id(vocab.bos)
    if vocab.eos is not None:
        writer.add_eos_token_id(vocab.eos)
    writer.add_add_bos_token(False)  # the bench feeds ids: nothing is prepended to them

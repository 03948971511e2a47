"""The vocabulary as the grammar library sees it: every token's bytes, for the two ways Llama
checkpoints spell bytes.

A mask is only right if the library knows what bytes each id writes. Llama 3, SmolLM2 and the
shipped model use byte-level BPE (GPT-2's table maps every byte to a printable character);
Llama 2 and TinyLlama use a SentencePiece-style BPE with ``▁`` for a space and byte-fallback
tokens ``<0x00>`` ... ``<0xFF>`` for bytes the merges do not cover. Special tokens write no text
and must never be allowed, except an EOS where the grammar is complete.

The reference here is not the library's: each token's bytes are decoded by the rules above, in
Python, and the allowed set at the start of a language is every token whose bytes can begin a
string of it, as Python's ``re`` decides on bytes.
"""

from __future__ import annotations

import re

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from nanoserve.structured.backend import GrammarBackend
from nanoserve.structured.mask import allowed, fill
from nanoserve.structured.params import StructuredOutputsParams as Spec

WORDS = ["the", "a", "café", "é", "éa", "ab", "cat", "dog", "é.", "x.", ".", " ", "Z", "9",
         "{", "\"", "ü", "日本"]
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
# (é|[a-z ])+ then a period: é is two bytes, C3 A9, so a lone C3 may begin it and A9 may not
LANGUAGE = "(é|[a-z ])+\\."
CAN_BEGIN = [re.compile(rb"(?:\xc3\xa9|[a-z ])*\xc3?"), re.compile(rb"(?:\xc3\xa9|[a-z ])+\.")]


def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted (character -> byte)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def byte_level() -> tuple[str, dict[int, bytes | None], list[int]]:
    """Llama 3's layout: the 256 byte symbols, some words, three special tokens."""
    to_byte = _gpt2_bytes()
    vocab = {ch: i for i, ch in enumerate(sorted(to_byte, key=to_byte.get))}
    for w in WORDS:
        vocab.setdefault("".join(chr_of(b, to_byte) for b in w.encode()), len(vocab))
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    spelled = {i: bytes(to_byte[c] for c in s) for s, i in vocab.items()}
    spelled |= {tok.token_to_id(s): None for s in SPECIAL}
    return tok.to_str(), spelled, [tok.token_to_id("<|eot_id|>")]


def chr_of(b: int, to_byte: dict[str, int]) -> str:
    return next(c for c, v in to_byte.items() if v == b)


def byte_fallback() -> tuple[str, dict[int, bytes | None], list[int]]:
    """Llama 2's layout: <unk> <s> </s>, the 256 byte-fallback tokens, then pieces with ▁."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab |= {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for w in WORDS:
        vocab.setdefault(w.replace(" ", "▁"), len(vocab))
        vocab.setdefault("▁" + w, len(vocab))
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    spelled: dict[int, bytes | None] = {}
    for s, i in vocab.items():
        m = re.fullmatch(r"<0x([0-9A-F]{2})>", s)
        spelled[i] = (bytes([int(m[1], 16)]) if m else None if s in ("<unk>", "<s>", "</s>")
                      else s.replace("▁", " ").encode())
    return tok.to_str(), spelled, [2]


@pytest.mark.parametrize("build", [byte_level, byte_fallback], ids=["byte-level", "byte-fallback"])
def test_the_first_mask_allows_exactly_the_tokens_that_can_begin_the_language(build):
    text, spelled, eos = build()
    width = max(spelled) + 1 + 7  # logits wider than the vocabulary: the tail is never allowed
    backend = GrammarBackend(text, width, eos)
    m = backend.matcher(Spec(regex=LANGUAGE))
    ok = allowed(fill([m], width), width)[0]
    want = {i for i, b in spelled.items() if b and any(p.fullmatch(b) for p in CAN_BEGIN)}
    assert {int(i) for i in ok.nonzero().flatten()} == want
    assert any(spelled[i] == b"\xc3" for i in want)  # half a character may begin it
    assert not any(spelled[i] == b"\xa9" for i in want)  # the other half may not

    # spell "é." token by token: then only the grammar's EOS may follow
    for piece in (b"\xc3", b"\xa9", b"."):
        token = next(i for i, b in spelled.items() if b == piece)
        assert m.consume_token(token), piece
    ok = allowed(fill([m], width), width)[0]
    assert {int(i) for i in ok.nonzero().flatten()} == set(eos)

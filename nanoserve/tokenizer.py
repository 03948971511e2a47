"""Text in, token ids out, and back again, exactly as the checkpoint's own tokenizer does it.

Why this module exists: the model only sees integers, and three details decide whether those
integers are the ones it was trained on: whether a BOS token leads the prompt, which ids end a
reply (Llama 3.1 and 3.2 Instruct list three), and how a chat is laid out (the checkpoint's jinja
template).
Getting any of them wrong gives fluent-looking nonsense, never an error. This module reads all
three from the checkpoint folder (``tokenizer.json``, ``tokenizer_config.json``,
``generation_config.json``, ``config.json``) and nowhere else.

It also streams text: ``IncrementalDetokenizer`` turns one token at a time into text deltas that
never cut a multi-byte character in half (a byte-level BPE token can be a third of an emoji).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path

from jinja2 import TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from nanoserve.config import _as_id_tuple


def _token_text(value) -> str | None:
    """tokenizer_config.json spells special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


class Tokenizer:
    def __init__(self, tok: HFTokenizer, bos_token: str | None, eos_token: str | None,
                 eos_token_ids: tuple[int, ...], add_bos_token: bool,
                 chat_template: str | None):
        self.tok = tok
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_token_id = tok.token_to_id(bos_token) if bos_token else None
        self.eos_token_ids = eos_token_ids
        self.add_bos_token = add_bos_token
        self.chat_template = chat_template
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"model folder {model_dir}: tokenizer.json is missing "
                             f"(pass skip_tokenizer_init=True to use token ids only)")
        tok = HFTokenizer.from_file(str(path))
        tcfg = _read_json(model_dir / "tokenizer_config.json")
        bos, eos = _token_text(tcfg.get("bos_token")), _token_text(tcfg.get("eos_token"))
        # EOS ids: generation_config.json wins (Llama 3.1/3.2 Instruct list three), then
        # config.json, then the tokenizer's eos_token.
        eos_ids = (_as_id_tuple(_read_json(model_dir / "generation_config.json")
                                .get("eos_token_id"))
                   or _as_id_tuple(_read_json(model_dir / "config.json").get("eos_token_id")))
        if not eos_ids and eos and tok.token_to_id(eos) is not None:
            eos_ids = (tok.token_to_id(eos),)
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"),
                            None)
        jinja = model_dir / "chat_template.jinja"
        if template is None and jinja.is_file():
            template = jinja.read_text()
        return cls(tok, bos, eos, eos_ids, bool(tcfg.get("add_bos_token", False)), template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The tokenizer's post-processor adds BOS where it is set up to (Llama 3 does);
        ``add_bos_token`` in tokenizer_config.json adds it where it is not. Never twice."""
        ids = self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        if (add_special_tokens and self.add_bos_token and self.bos_token_id is not None
                and ids[:1] != [self.bos_token_id]):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False, tools: list[dict] | None = None,
                            **kwargs) -> str | list[int]:
        """Render the checkpoint's jinja chat template, as transformers does: in a sandbox
        (``ImmutableSandboxedEnvironment``, ``trim_blocks`` and ``lstrip_blocks``), with
        ``messages``, ``tools`` (``None`` when there are none, as transformers passes it, so a
        template's ``tools is none`` holds), ``add_generation_prompt``, ``bos_token``,
        ``eos_token``, any extra variables in ``kwargs`` (``enable_thinking``), and the two
        functions templates call, ``raise_exception(msg)`` and ``strftime_now(fmt)``. Every
        failure is a ``ValueError`` that says what went wrong: no template, a template that does
        not parse (with its line), the template's own ``raise_exception`` (with its message,
        e.g. a family's "roles must alternate"), or an error while it ran."""
        if self.chat_template is None:
            raise ValueError("this checkpoint has no chat_template; send a plain prompt instead")
        template = _compile(self.chat_template)
        try:
            text = template.render(messages=messages, tools=tools,
                                   add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                   **kwargs)
        except TemplateRaised:
            raise
        except TemplateError as e:  # an undefined call, a sandbox refusal, ...
            raise ValueError(f"chat template failed: {type(e).__name__}: {e}") from None
        except Exception as e:  # the template is code: 'a' + 1, a division by zero, ...
            raise ValueError(f"chat template failed: {type(e).__name__}: {e}") from None
        return self.encode(text, add_special_tokens=False) if tokenize else text


class TemplateRaised(ValueError):
    """A chat template's own ``raise_exception(message)``: its message, as the template says
    it (a family's rule, such as roles that must alternate)."""


def _raise_exception(message):
    raise TemplateRaised(f"chat template: {message}")


def _tojson(x, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


# transformers' environment: a sandbox (a template cannot reach Python's internals), blocks
# trimmed as it trims them, its two functions and its tojson.
_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                     extensions=["jinja2.ext.loopcontrols"])
_ENV.filters["tojson"] = _tojson
_ENV.globals["raise_exception"] = _raise_exception
_ENV.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(source: str):
    """The template, parsed once per distinct text; one that does not parse is a
    ``ValueError`` naming its line."""
    try:
        return _ENV.from_string(source)
    except TemplateSyntaxError as e:
        raise ValueError(f"chat template does not parse: line {e.lineno}: {e.message}") from None


class IncrementalDetokenizer:
    """Token ids in, text deltas out, one token at a time.

    It decodes a short window of recent tokens twice, with and without the newest one, and emits
    the difference, but only once the difference no longer ends in U+FFFD (the replacement
    character a partial UTF-8 sequence decodes to). The window starts a few tokens before the
    text already emitted so that tokenizers which drop a leading space (SentencePiece) still
    produce the right spacing.

    >>> # for a byte-level tokenizer, "é" may be two tokens: the first push returns "",
    >>> # the second returns "é".
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int],
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids = list(prompt_ids[-6:])  # context for spacing only
        self.prefix_offset = max(len(self.ids) - 5, 0)
        self.read_offset = len(self.ids)
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = decode(self.ids[self.prefix_offset:], self.skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

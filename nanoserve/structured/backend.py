"""One engine's grammar backend: the tokenizer as llguidance sees it, and compiled grammars.

Why this module exists: building llguidance's view of a vocabulary reads every token's bytes
(about a second for a 128k vocabulary), and compiling a grammar against it is the step that
catches a bad schema, so both happen once: the tokenizer view when the first constrained
request arrives, each distinct spec's grammar when it is first seen. The compiled grammar is
kept as a *template*, a matcher at the start of its language that no request ever advances,
in a bounded LRU keyed by ``spec.key``. A request gets ``template.deep_copy()``: the parser's
tables are shared and already built, so a copy costs a few microseconds where compiling costs
a fraction of a millisecond to many (Day 68 measures both).

The view is as wide as the logits (``n_vocab`` = the model's ``vocab_size``): ids the tokenizer
does not have get no bytes, so no grammar ever allows them. EOS is the model's EOS ids.

Threads: the server compiles on a worker thread (``asyncio.to_thread``) while the event loop
builds requests from the cache, so the cache is behind a lock; a matcher, once handed out,
belongs to its one request.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from nanoserve.structured.params import StructuredOutputsParams
from nanoserve.validation import InvalidRequest

CACHE_SIZE = 256  # distinct specs whose compiled template is kept


class GrammarBackend:
    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids,
                 capacity: int = CACHE_SIZE):
        from llguidance import LLTokenizer

        eos = sorted(eos_token_ids)
        self.tokenizer = LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                     eos_token=eos if eos else None)
        self.vocab_size, self.capacity = vocab_size, capacity
        self.templates: OrderedDict[str, object] = OrderedDict()  # spec.key -> LLMatcher
        self._lock = threading.Lock()
        self.compiled = self.hits = 0  # grammars built, and requests that found theirs cached
        self.compile_s = 0.0  # seconds spent compiling, over every spec compiled

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab_size: int, eos_token_ids) -> GrammarBackend:
        """From a ``nanoserve.tokenizer.Tokenizer`` (its ``tokenizers`` object's JSON)."""
        return cls(tokenizer.tok.to_str(), vocab_size, eos_token_ids)

    def compile(self, spec: StructuredOutputsParams):
        """A fresh, uncached matcher for ``spec``: the spec's grammar text, checked, compiled.
        A bad spec is an ``InvalidRequest`` naming ``structured_outputs`` with the library's
        reason; a warning (a keyword it would drop) is a refusal too, never ignored."""
        from llguidance import LLMatcher

        try:
            text = spec.lark()
        except Exception as e:  # noqa: BLE001 - the library's parse errors, whatever their type
            raise InvalidRequest(f"structured_outputs: {spec.kind}: {e}",
                                 "structured_outputs") from None
        bad, messages = LLMatcher.validate_grammar_with_warnings(text, self.tokenizer)
        if bad or messages:
            why = "; ".join(" ".join(ln.strip() for ln in m.strip().splitlines() if ln.strip())
                            for m in messages)[:500] or "invalid"
            raise InvalidRequest(f"structured_outputs: {spec.kind}: {why}",
                                 "structured_outputs")
        m = LLMatcher(self.tokenizer, text)
        if m.is_error():
            raise InvalidRequest(f"structured_outputs: {spec.kind}: {m.get_error()}",
                                 "structured_outputs")
        return m

    def template(self, spec: StructuredOutputsParams):
        """The spec's compiled template, from the cache or compiled now (and cached)."""
        key = spec.key
        with self._lock:
            if key in self.templates:
                self.templates.move_to_end(key)
                self.hits += 1
                return self.templates[key]
        t0 = time.perf_counter()
        m = self.compile(spec)  # outside the lock: another spec may compile meanwhile
        with self._lock:
            self.compile_s += time.perf_counter() - t0
            if key in self.templates:  # a racing thread compiled it first: keep one
                return self.templates[key]
            self.templates[key] = m
            self.compiled += 1
            if len(self.templates) > self.capacity:  # least recently used goes
                self.templates.popitem(last=False)
            return m

    def matcher(self, spec: StructuredOutputsParams):
        """A request's own matcher at the start of ``spec``'s language."""
        template = self.template(spec)
        with self._lock:  # a copy reads the template; no copy runs beside another
            return template.deep_copy()

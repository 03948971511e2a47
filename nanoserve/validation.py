"""``InvalidRequest`` and the door check: what every front door refuses, said once.

Why this module exists: a request can be refused by the offline API, the async engine or the HTTP
server, and each must refuse the same things for the same reasons. The refusal is typed: an
``InvalidRequest`` is a ``ValueError`` that carries the request field it is about (``param``)
and the offending value, so the server answers a 400 whose ``param`` comes from the check itself,
never from reading the message, and rewording a message cannot change the API.

``check_prompt_ids`` is the one door check on a prompt: not empty, every id inside the
vocabulary, and one position left for generation within ``max_model_len``. The one check
against the pool (a request whose worst case exceeds the whole empty pool could never run, and
waiting for it would hang) is the KV manager's (``KVCacheManager.check_fits``).

>>> check_prompt_ids([1, 2, 3], vocab_size=32, max_model_len=8)
>>> try:
...     check_prompt_ids([1, 40], vocab_size=32, max_model_len=8, who="prompt 0")
... except InvalidRequest as e:
...     print(e.param, e.value, "|", e)
prompt 40 | prompt 0: token id 40 is outside the vocabulary (vocab_size=32)
"""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request the engine will not run. ``param`` names the request field at fault (the
    HTTP layer may rename it to its own wire name); ``value`` is what was sent, when useful."""

    def __init__(self, message: str, param: str | None = None, value: object = None):
        super().__init__(message)
        self.param, self.value = param, value


def check_prompt_ids(ids: list[int], vocab_size: int, max_model_len: int,
                     param: str = "prompt", who: str | None = None) -> None:
    """Refuse an empty prompt, an id outside ``[0, vocab_size)``, and a prompt that leaves
    generation no position (``len(ids) >= max_model_len``)."""
    who = who or param
    if not ids:
        raise InvalidRequest(f"{who} is empty", param)
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(f"{who}: token id {bad} is outside the vocabulary "
                             f"(vocab_size={vocab_size})", param, bad)
    if len(ids) >= max_model_len:
        raise InvalidRequest(f"{who} has {len(ids)} tokens; max_model_len is {max_model_len} "
                             f"and generation needs one free position: this model's maximum "
                             f"context length is {max_model_len} tokens, so reduce the length "
                             f"of the input", param, len(ids))

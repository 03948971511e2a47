"""Speculative decoding (Days 76-78): proposals, and a verify step that changes no output.

Why this package exists: a decode step on a CPU costs about the same for one token as for a
few (the weights are read once for up to 8 rows), so tokens guessed ahead and checked in one
forward are tokens nearly for free, provided checking them never changes what the engine would
have written. The parts, one file each:

- ``proposer.py``: what a proposer is (``Proposer``) and the registry from
  ``speculative_config``'s ``method`` to its class;
- ``ngram.py``: prompt lookup, vLLM's n-gram proposer (``backoff.py``: a policy that pauses
  proposals for a request whose recent proposals were all rejected);
- ``draft.py``: a smaller model proposing one token at a time, batched, over its own KV;
- ``rejection.py``: the rejection sampler, greedy and Leviathan et al.'s rule, applying every
  sampling parameter to the target distribution exactly as a plain step does;
- ``stats.py``: the counters, with vLLM's names.

The engine (``nanoserve.engine``) schedules and verifies; this package proposes and judges.

May import: model, sampling, structured, layers, attention, cpu, cuda, quantization, tokenizer,
validation, testing, config.
"""

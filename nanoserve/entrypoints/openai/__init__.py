"""The OpenAI-compatible server: the app, its endpoints, streaming, errors, and ``serve``.

Why this package exists: the official ``openai`` client, curl and every tool built for vLLM should
work against nanoserve unchanged, and each part of that promise reads whole in its own file:

- ``app.py``: ``build_app``, the lifespan, ``/health``, ``/version``, ``/metrics``, ``/v1/models``
  and the API key; ``context.py``: the per-app ``ServingContext`` every route reads;
- ``completions.py``, ``chat.py``, ``tokenization.py``: one endpoint family each;
- ``parsing.py``: the door they share (body, validation, checks, engine jobs);
- ``fanout.py`` and ``streaming.py``: the engine requests behind one response, and SSE;
- ``errors.py``: OpenAI's error shape; ``protocol.py``: the wire models; ``logprobs.py``: their
  logprob shapes; ``metrics.py``: Prometheus; ``serve.py``: ``nanoserve serve``.
"""

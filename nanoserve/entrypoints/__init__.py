"""The ways in from outside the process: today one, the OpenAI-compatible HTTP server.

Why this package exists: the engine (core, ``LLM``, ``AsyncLLM``) knows nothing of HTTP, and the
layer that speaks a wire protocol should sit above it where it can be read, and replaced, whole.
vLLM keeps the same split under ``vllm/entrypoints/``.

May import: ``nanoserve.async_engine`` and what lies below it (ARCHITECTURE.md).
"""

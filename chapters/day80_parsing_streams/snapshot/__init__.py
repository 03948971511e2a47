"""Day 80's frozen pieces: a streaming reader of Hermes tool calls (``hermes``) and a splitter of
``<think>...</think>`` from the answer (``think``), each with the one rule that keeps a stream
honest: hold back only what could still become a marker (``holdback``)."""

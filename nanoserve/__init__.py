"""nanoserve: an LLM inference engine built from scratch, one day at a time.

    >>> from nanoserve import LLM, SamplingParams
    >>> llm = LLM()                      # the shipped nanoserve-tiny checkpoint
    >>> out = llm.generate(["The for statement"], SamplingParams(temperature=0, max_tokens=20))

The serving engine is ``LLM``'s sibling over the same kind of core; both take ``EngineConfig``'s
options (``AsyncLLM(EngineConfig(max_num_seqs=16))``, or ``LLM(max_num_seqs=16)``).
"""

from importlib.metadata import version

from nanoserve.async_engine import AsyncLLM
from nanoserve.config import EngineConfig
from nanoserve.llm import LLM, RequestOutput
from nanoserve.sampling.params import SamplingParams
from nanoserve.structured.params import StructuredOutputsParams

__all__ = ["AsyncLLM", "EngineConfig", "LLM", "RequestOutput", "SamplingParams",
           "StructuredOutputsParams"]
__version__ = version("nanoserve")  # pyproject.toml's, as installed

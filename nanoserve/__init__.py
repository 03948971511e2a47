"""nanoserve: an LLM inference engine built from scratch, one day at a time.

    >>> from nanoserve import LLM, SamplingParams
    >>> llm = LLM()                      # the shipped nanoserve-tiny checkpoint
    >>> out = llm.generate(["The for statement"], SamplingParams(temperature=0, max_tokens=20))
"""

from .llm import LLM, RequestOutput
from .sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

"""A checkpoint's sampling defaults, from its ``generation_config.json``.

Why this module exists: a model's authors often say how it should be sampled (Qwen3: temperature
0.6, top_p 0.95, top_k 20; Llama 3.2 Instruct: 0.6 and 0.9), and they say it in
``generation_config.json``. vLLM applies those values to every request that does not set the
field itself (``--generation-config auto``, its default); ``vllm`` ignores the file, and a folder
reads the file from there. nanoserve does the same, through the ``generation_config`` option.

The keys read are vLLM's: ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``repetition_penalty``, and ``max_new_tokens`` (as ``max_tokens``). The file's other sampling
keys are reported as ignored, never silently dropped: ``do_sample`` (transformers samples
greedily when it is false; vLLM and nanoserve apply the temperature anyway), beam search
(``num_beams``), ``typical_p``, ``min_new_tokens``, ``no_repeat_ngram_size`` and the rest. The
token ids (``eos_token_id`` and kin) are not sampling rules: the tokenizer reads EOS from this
file already (``nanoserve/tokenizer.py``).

>>> print(GenerationDefaults("x/generation_config.json", {"temperature": 0.6}, ("do_sample",))
...       .describe())
temperature=0.6 from x/generation_config.json (a request's own value wins; ignored: do_sample)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

GENERATION_SOURCES = ("auto", "vllm")  # or a folder that holds a generation_config.json

# generation_config.json's name -> SamplingParams' name, for the keys vLLM reads
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                 "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                 "max_new_tokens": "max_tokens"}
# keys that are no sampling rule: token ids (the tokenizer reads EOS) and bookkeeping
NOT_SAMPLING = frozenset({"bos_token_id", "eos_token_id", "pad_token_id",
                          "decoder_start_token_id", "transformers_version", "_from_model_config",
                          "cache_implementation", "use_cache", "return_dict_in_generate",
                          "output_attentions", "output_hidden_states", "output_scores",
                          "output_logits"})


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    """The defaults a request starts from: ``values`` by ``SamplingParams``' names."""

    source: str  # the file read, or why none was
    values: dict = field(default_factory=dict)
    ignored: tuple[str, ...] = ()  # the file's sampling keys nanoserve does not apply

    def describe(self) -> str:
        said = ", ".join(f"{k}={v}" for k, v in self.values.items()) or "no sampling defaults"
        tail = "a request's own value wins" if self.values else ""
        if self.ignored:
            tail += ("; " if tail else "") + "ignored: " + ", ".join(self.ignored)
        return f"{said} from {self.source}" + (f" ({tail})" if tail else "")


def read_generation_defaults(option: str, model_dir: Path) -> GenerationDefaults:
    """The defaults ``option`` (``auto``, ``vllm`` or a folder) names for ``model_dir``. A value
    of the wrong type is a ``ValueError`` naming the file and the key; its range is checked by
    ``SamplingParams``, once, when the engine loads."""
    if option == "vllm":
        return GenerationDefaults("nowhere (generation_config=vllm: vLLM's defaults)")
    path = Path(model_dir if option == "auto" else option) / "generation_config.json"
    if not path.is_file():
        return GenerationDefaults(f"{path} (no such file)")
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    values, ignored = {}, []
    for key, value in raw.items():
        if key in SAMPLING_KEYS:
            if value is None:
                continue
            whole = key in ("top_k", "max_new_tokens")
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
                raise ValueError(f"{path}: {key}={value!r} must be "
                                 f"{'an int' if whole else 'a number'}")
            values[SAMPLING_KEYS[key]] = value
        elif key not in NOT_SAMPLING:
            ignored.append(key)
    return GenerationDefaults(str(path), values, tuple(ignored))

"""Each family's published chat format, tools included, and the tokenizer that carries it.

Why this module exists: the random checkpoints of ``checkpoints.py`` need a tokenizer and a chat
template for a server to talk to them, and tool calling needs each family's own way of listing
tools, writing a call and answering it. The special tokens, turn markers, tags and rules below
are each family's published facts; the templates and their instruction sentences are this
project's own text. ``tests/test_chat_render.py`` renders them with transformers too and holds
the two renderings equal, and holds every history without tools to the bytes the templates gave
before tools existed.

The tool formats, per family:

- qwen2, qwen3 (Hermes, as Qwen 2.5 and Qwen 3 publish it): a system block lists the tools
  inside ``<tools></tools>``, one JSON object a line (the request's system message, if any,
  leads it); a call is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` after
  the assistant's text; consecutive tool results share one user turn, each inside
  ``<tool_response>\\n...\\n</tool_response>``. Qwen 3 adds ``<think>``: an assistant turn after
  the last user message writes its ``reasoning_content`` inside ``<think>\\n...\\n</think>\\n\\n``,
  and ``enable_thinking=False`` ends the generation prompt with an empty think block;
- llama (Llama 3.2's JSON tools): ``Environment: ipython`` in the system header, the tools as
  indented JSON at the head of the first user message with the instruction to answer
  ``{"name": ..., "parameters": {...}}``, a call written so, tool results in ``ipython`` turns.
  Llama's own template refuses more than one call in a message; this one joins them with
  ``; ``, which vLLM's llama3_json parser reads back;
- mistral (v0.3's tool markers over the v0.1 layout): ``[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]``
  before the last user message, ``[TOOL_CALLS] [{"name", "arguments", "id"}, ...]`` then EOS for
  a call, ``[TOOL_RESULTS] {"content", "call_id"}[/TOOL_RESULTS]`` for a result; roles alternate
  with tool traffic skipped, as v0.3 checks. The markers are plain text to these
  character-level tokenizers. v0.3 insists on 9-character call ids; ids are written as given;
- gemma3, phi3 (no official tool format): the tools as one JSON list in the system prompt (folded
  into the first user turn for Gemma, a ``<|system|>`` turn for Phi-3), calls and results in
  Hermes's tags, results as a user turn, so the hermes parser reads these models' calls.
"""

from __future__ import annotations

from pathlib import Path

# ---------------------------------------------------------------------------- shared pieces
# The rule v0.1-style templates enforce, counted on ns.index so that tool traffic (a call, its
# results) can stand outside the count; without tools ns.index is loop.index0.
_ALTERNATE = ("{%- if (message['role'] == 'user') != (ns.index % 2 == 0) %}"
              "{{- raise_exception('conversation roles must alternate "
              "user/assistant/user/assistant/...') }}{%- endif %}\n"
              "{%- set ns.index = ns.index + 1 %}\n")
# one call as Hermes writes it: {"name": "...", "arguments": {...}} (arguments a dict; a string
# is written as it is)
_CALL_JSON = ("{%- set fn = call['function'] if call['function'] is defined else call %}\n"
              "{{- '{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}\n"
              "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}"
              "{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}\n"
              "{{- '}' }}\n")
_HERMES_HOW = ("To call a function, answer with a JSON object holding its name and its "
               "arguments inside <tool_call></tool_call> tags:\\n<tool_call>\\n"
               "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>")
# Hermes's calls after an assistant's text, for the templates that borrow them (Gemma, Phi-3)
_HERMES_CALLS = ("{%- for call in message['tool_calls'] %}\n"
                 "{%- if message['content'] | trim or not loop.first %}{{- '\\n' }}{%- endif %}\n"
                 "{{- '<tool_call>\\n' }}\n" + _CALL_JSON + "{{- '\\n</tool_call>' }}\n"
                 "{%- endfor %}\n")
# tools as one JSON list, for the families with no published format
_TOOLS_LIST = ("{%- set tools_text = '# Tools\\n\\nYou can call the functions this JSON list "
               "defines:\\n' + (tools | tojson) + '\\n\\n" + _HERMES_HOW + "' %}\n")


def _chatml(think: bool) -> str:
    """ChatML with Hermes's tools (qwen2; with ``think``, qwen3's reasoning as well)."""
    reasoning = (
        "{%- set reasoning = message['reasoning_content'] if message['reasoning_content'] is "
        "string else '' %}\n"
        "{%- if message['role'] == 'assistant' and reasoning and loop.index0 > ns.last_user %}\n"
        "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}\n"
        "{%- endif %}\n") if think else ""
    last_user = ("{%- set ns = namespace(last_user=-1) %}\n"
                 "{%- for message in turns %}{%- if message['role'] == 'user' %}"
                 "{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}\n"
                 ) if think else ""
    no_think = ("{%- if enable_thinking is defined and enable_thinking is false %}"
                "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\n") if think else ""
    return (
        "{%- if tools %}\n"
        "{{- '<|im_start|>system\\n' }}\n"
        "{%- if messages and messages[0]['role'] == 'system' %}"
        "{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}\n"
        "{{- '# Tools\\n\\nYou can call the functions below to help with the request.\\n\\n"
        "Their signatures, one JSON object a line, are inside <tools></tools>:\\n<tools>' }}\n"
        "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}\n"
        "{{- '\\n</tools>\\n\\n" + _HERMES_HOW + "<|im_end|>\\n' }}\n"
        "{%- set turns = messages[1:] if messages and messages[0]['role'] == 'system' "
        "else messages %}\n"
        "{%- else %}{%- set turns = messages %}{%- endif %}\n" + last_user +
        "{%- for message in turns %}\n"
        "{%- if message['role'] == 'tool' %}\n"
        "{%- if loop.first or turns[loop.index0 - 1]['role'] != 'tool' %}"
        "{{- '<|im_start|>user' }}{%- endif %}\n"
        "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}\n"
        "{%- if loop.last or turns[loop.index0 + 1]['role'] != 'tool' %}"
        "{{- '<|im_end|>\\n' }}{%- endif %}\n"
        "{%- else %}\n"
        "{{- '<|im_start|>' + message['role'] + '\\n' }}\n" + reasoning +
        "{{- message['content'] }}\n"
        "{%- if message['role'] == 'assistant' and message['tool_calls'] %}\n"
        "{%- for call in message['tool_calls'] %}\n"
        "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}\n"
        "{{- '<tool_call>\\n' }}\n" + _CALL_JSON + "{{- '\\n</tool_call>' }}\n"
        "{%- endfor %}\n"
        "{%- endif %}\n"
        "{{- '<|im_end|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}\n" + no_think +
        "{%- endif %}\n")


_LLAMA_HOW = ("Given the following functions, answer with a JSON object for the call that "
              "best serves the request, in the format {\"name\": function name, "
              "\"parameters\": dictionary of argument name and its value}. Do not use "
              "variables.\\n\\n")
CHAT_TEMPLATES: dict[str, str] = {
    "qwen2": _chatml(think=False),
    "qwen3": _chatml(think=True),
    "llama": (
        "{{- bos_token }}\n"
        "{%- if messages and messages[0]['role'] == 'system' %}\n"
        "{%- set system, turns = messages[0]['content'] | trim, messages[1:] %}\n"
        "{%- else %}{%- set system, turns = '', messages %}{%- endif %}\n"
        "{%- set today = date_string if date_string is defined else strftime_now('%d %b %Y') %}\n"
        "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
        "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}\n"
        "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + today + '\\n\\n' }}\n"
        "{{- system + '<|eot_id|>' }}\n"
        "{%- if tools %}\n"
        "{%- if not turns or turns[0]['role'] != 'user' %}"
        "{{- raise_exception('tools are listed in the first user message, and there is "
        "none') }}{%- endif %}\n"
        "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n" + _LLAMA_HOW + "' }}\n"
        "{%- for tool in tools %}{{- (tool | tojson(indent=4)) + '\\n\\n' }}{%- endfor %}\n"
        "{{- turns[0]['content'] | trim + '<|eot_id|>' }}\n"
        "{%- set turns = turns[1:] %}\n"
        "{%- endif %}\n"
        "{%- for message in turns %}\n"
        "{%- if message['role'] == 'tool' %}\n"
        "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] "
        "+ '<|eot_id|>' }}\n"
        "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}\n"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- for call in message['tool_calls'] %}\n"
        "{%- if not loop.first %}{{- '; ' }}{%- endif %}\n"
        "{{- '{\"name\": \"' + call['function']['name'] + '\", \"parameters\": ' "
        "+ (call['function']['arguments'] | tojson) + '}' }}\n"
        "{%- endfor %}\n"
        "{{- '<|eot_id|>' }}\n"
        "{%- else %}\n"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
        "{{- message['content'] | trim + '<|eot_id|>' }}\n"
        "{%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n"),
    "mistral": (
        "{{- bos_token }}\n"
        "{%- set ns = namespace(index=0, last_user=-1) %}\n"
        "{%- for message in messages %}{%- if message['role'] == 'user' %}"
        "{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}\n"
        "{%- for message in messages %}\n"
        "{%- if message['role'] not in ['user', 'assistant', 'tool'] %}\n"
        "{{- raise_exception('the ' + message['role'] + ' role is not supported: this model "
        "takes user and assistant messages only') }}{%- endif %}\n"
        "{%- if message['role'] != 'tool' and not message['tool_calls'] %}\n" + _ALTERNATE +
        "{%- endif %}\n"
        "{%- if message['role'] == 'user' %}\n"
        "{%- if tools and loop.index0 == ns.last_user %}"
        "{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}\n"
        "{{- '[INST] ' + message['content'] + ' [/INST]' }}\n"
        "{%- elif message['role'] == 'tool' %}\n"
        "{%- set result = {'content': message['content']} %}\n"
        "{%- if message['tool_call_id'] is defined %}"
        "{%- set result = {'content': message['content'], 'call_id': message['tool_call_id']} %}"
        "{%- endif %}\n"
        "{{- '[TOOL_RESULTS] ' + (result | tojson) + '[/TOOL_RESULTS]' }}\n"
        "{%- elif message['tool_calls'] %}\n"
        "{{- '[TOOL_CALLS] [' }}\n"
        "{%- for call in message['tool_calls'] %}\n"
        "{%- if not loop.first %}{{- ', ' }}{%- endif %}\n"
        "{{- {'name': call['function']['name'], 'arguments': call['function']['arguments'], "
        "'id': call['id']} | tojson }}\n"
        "{%- endfor %}\n"
        "{{- ']' + eos_token }}\n"
        "{%- else %}{{- message['content'] + eos_token }}{%- endif %}\n"
        "{%- endfor %}\n"),
    "gemma3": (
        "{{- bos_token }}\n"
        "{%- if messages and messages[0]['role'] == 'system' %}\n"
        "{%- set lead, turns = messages[0]['content'] + '\\n\\n', messages[1:] %}\n"
        "{%- else %}{%- set lead, turns = '', messages %}{%- endif %}\n"
        "{%- if tools %}\n" + _TOOLS_LIST +
        "{%- set lead = lead + tools_text + '\\n\\n' %}\n"
        "{%- endif %}\n"
        "{%- set ns = namespace(index=0) %}\n"
        "{%- for message in turns %}\n"
        "{%- set after_tool = not loop.first and turns[loop.index0 - 1]['role'] == 'tool' %}\n"
        "{%- set before_tool = not loop.last and turns[loop.index0 + 1]['role'] == 'tool' %}\n"
        "{%- if message['role'] == 'tool' %}\n"
        "{%- if not after_tool %}\n"
        "{%- if ns.index % 2 == 1 %}{{- raise_exception('conversation roles must alternate "
        "user/assistant/user/assistant/...') }}{%- endif %}\n"
        "{%- set ns.index = ns.index + 1 %}\n"
        "{{- '<start_of_turn>user\\n' + (lead if loop.first else '') }}\n"
        "{%- else %}{{- '\\n' }}{%- endif %}\n"
        "{{- '<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}\n"
        "{%- if not before_tool %}{{- '<end_of_turn>\\n' }}{%- endif %}\n"
        "{%- else %}\n" + _ALTERNATE +
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}\n"
        "{{- '<start_of_turn>' + role + '\\n' + (lead if loop.first else '') }}\n"
        "{{- message['content'] | trim }}\n"
        "{%- if message['role'] == 'assistant' and message['tool_calls'] %}\n" + _HERMES_CALLS +
        "{%- endif %}\n"
        "{{- '<end_of_turn>\\n' }}\n"
        "{%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}\n"),
    "phi3": (
        "{%- set turns = messages %}\n"
        "{%- if tools %}\n" + _TOOLS_LIST +
        "{%- if messages and messages[0]['role'] == 'system' %}\n"
        "{%- set tools_text, turns = messages[0]['content'] + '\\n\\n' + tools_text, "
        "messages[1:] %}{%- endif %}\n"
        "{{- '<|system|>\\n' + tools_text + '<|end|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- for message in turns %}\n"
        "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}\n"
        "{{- raise_exception('the ' + message['role'] + ' role is not supported') }}"
        "{%- endif %}\n"
        "{%- if message['role'] == 'tool' %}\n"
        "{%- if loop.first or turns[loop.index0 - 1]['role'] != 'tool' %}"
        "{{- '<|user|>\\n' }}{%- else %}{{- '\\n' }}{%- endif %}\n"
        "{{- '<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}\n"
        "{%- if loop.last or turns[loop.index0 + 1]['role'] != 'tool' %}"
        "{{- '<|end|>\\n' }}{%- endif %}\n"
        "{%- else %}\n"
        "{{- '<|' + message['role'] + '|>\\n' + message['content'] }}\n"
        "{%- if message['role'] == 'assistant' and message['tool_calls'] %}\n" + _HERMES_CALLS +
        "{%- endif %}\n"
        "{{- '<|end|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}\n"),
}
# family -> its special tokens: the first is BOS (id 0), the last EOS (the last id), as BASE
# numbers them; None: the family writes no BOS (Qwen).
SPECIAL_TOKENS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "llama": ("<|begin_of_text|>", ("<|begin_of_text|>", "<|end_of_text|>",
                                    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    "qwen2": (None, ("<|endoftext|>", "<|im_start|>", "<|im_end|>")),
    "qwen3": (None, ("<|endoftext|>", "<|im_start|>", "<|im_end|>")),
    "mistral": ("<s>", ("<s>", "[INST]", "[/INST]", "</s>")),
    "gemma3": ("<bos>", ("<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>")),
    "phi3": (None, ("<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>",
                    "<|endoftext|>")),
}


def write_tokenizer(path: str | Path, family: str = "llama", chat_template: str | None = None,
                    vocab_size: int | None = None) -> Path:
    """A character-level tokenizer for the checkpoint in ``path``, its vocabulary exactly the
    model's (``config.json``'s ``vocab_size``, e.g. 256): the family's special tokens (BOS at
    id 0, EOS at the last id, as ``BASE`` numbers them), ``<unk>``, printable ASCII, newline
    and tab, then fillers. Writes ``tokenizer.json`` and a ``tokenizer_config.json`` with the
    family's BOS and EOS and its chat template (``CHAT_TEMPLATES``, or ``chat_template``)."""
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models

    path = Path(path)
    if vocab_size is None:  # a multimodal checkpoint keeps it in its text_config
        config = json.loads((path / "config.json").read_text())
        vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    bos, specials = SPECIAL_TOKENS[family]
    chars = ["<unk>", "\n", "\t", *(chr(c) for c in range(32, 127))]
    if vocab_size < len(specials) + len(chars):
        raise ValueError(f"vocab_size={vocab_size} is below the {len(specials) + len(chars)} "
                         f"tokens a {family} tokenizer needs")
    middle = [*chars, *(f"<filler_{i}>" for i in range(vocab_size - len(specials)
                                                        - len(chars)))]
    order = [specials[0], *middle, *specials[1:]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(order)}, [], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()  # characters joined as they are
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(path / "tokenizer.json"))
    template = chat_template if chat_template is not None else CHAT_TEMPLATES[family]
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos,
        "eos_token": specials[-1], "unk_token": "<unk>", "add_bos_token": False,
        "chat_template": template}, indent=2))
    return path

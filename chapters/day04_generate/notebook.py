# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Day 4 notebook: from a prompt to text
#
# Day 1 gave us a forward pass: ids in, logits out. Today we wrap it in everything needed to
# turn a string into a reply: the checkpoint's tokenizer, a loop that picks one token at a time,
# a detokenizer that streams text without breaking characters, and the rules that decide when
# a reply is over. Everything runs on the shipped model, nanoserve-tiny, on a CPU.

# %%
import json
import pathlib
import sys
import time

ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from nanoserve import LLM, SamplingParams
from nanoserve.tokenizer import IncrementalDetokenizer

t_start = time.perf_counter()
llm = LLM(dtype="float32")
tok, model, cfg = llm.tokenizer, llm.model, llm.config
print(f"nanoserve-tiny: {model.num_parameters():,} parameters, vocab {cfg.vocab_size:,}, "
      f"context {cfg.max_position_embeddings} positions")

# %% [markdown]
# ## 1. The tokenizer
#
# A prompt becomes ids through the checkpoint's own `tokenizer.json`. This checkpoint asks for
# a BOS token twice over: its post-processor inserts `<|begin_of_text|>`, and
# `tokenizer_config.json` also says `add_bos_token: true`. The encoder adds BOS only if the
# post-processor has not already, so exactly one leads the prompt.

# %%
prompt = "The while statement"
ids = tok.encode(prompt)
print("ids:   ", ids)
print("tokens:", [tok.tok.id_to_token(i) for i in ids])
print("post-processor alone:", tok.tok.encode(prompt).ids,
      "| add_bos_token =", tok.add_bos_token)
assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
print(f"BOS id {tok.bos_token_id}; EOS ids {tok.eos_token_ids} (from generation_config.json)")
print("without special tokens:", tok.encode(prompt, add_special_tokens=False))

# %% [markdown]
# `Ġ` is how byte-level BPE spells a leading space. Characters outside the training text's
# alphabet have no merges, so each of their UTF-8 bytes becomes a token of its own, and a
# single byte of a multi-byte character decodes to nothing printable:

# %%
snake = tok.encode("é🐍", add_special_tokens=False)
print(snake, "->", [tok.decode([i]) for i in snake], "-> together:", repr(tok.decode(snake)))

# %% [markdown]
# ## 2. The loop, by hand
#
# The whole of Day 4's generation: run the model over every token so far, keep the logits of
# the last position, take the argmax, append, repeat. Shapes of the first step are printed.

# %%
seq = list(ids)
with torch.inference_mode():
    for step in range(24):
        x = torch.tensor([seq])                                    # (1, T)
        h = model(x, torch.arange(len(seq))[None])                 # (1, T, E)
        logits = model.compute_logits(h[0, -1])                    # (V,)
        if step == 0:
            print(f"x {tuple(x.shape)} -> h {tuple(h.shape)} -> last row "
                  f"{tuple(h[0, -1].shape)} -> logits {tuple(logits.shape)}")
        seq.append(int(logits.argmax()))
by_hand = seq[len(ids):]
engine = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24))[0]
print("hand loop == LLM.generate:", by_hand == engine.token_ids)
print(repr(prompt + engine.text))

# %% [markdown]
# ## 3. Streaming: one text delta per token
#
# `IncrementalDetokenizer.push` decodes a short window of recent ids with and without the new
# one and returns the difference. We replay the reply above through it and print each delta.

# %%
detok = IncrementalDetokenizer(tok, ids)
for t in engine.token_ids[:14]:
    print(f"{t:5d} {tok.tok.id_to_token(t)!r:>16} -> {detok.push(t)!r}")
assert detok.text == tok.decode(engine.token_ids[:14])

# %% [markdown]
# When a token ends part-way through a UTF-8 character, the window decodes to a string ending in
# U+FFFD (the replacement character), and the detokenizer holds it back until the rest arrives.
# The snake is four bytes, so three pushes return nothing and the fourth returns the whole emoji:

# %%
detok = IncrementalDetokenizer(tok, ids)
for t in tok.encode(" é and 🐍", add_special_tokens=False):
    print(f"{t:5d} -> {detok.push(t)!r}")
print("streamed:", repr(detok.text))

# %% [markdown]
# ## 4. The stop rules, each one firing
#
# After every token the engine asks, in order: is it an EOS id or one of `stop_token_ids`, or
# does the text now contain a `stop` string? Any of those ends the reply with
# `finish_reason="stop"`. Otherwise, has it used `max_tokens`, or filled the context? Those give
# `"length"`.

# %%
greedy = dict(temperature=0)


def show(label, out):
    print(f"{label:<30} finish={out.finish_reason!r:<9} stop_reason={out.stop_reason!r:<11} "
          f"{len(out.token_ids):>2} tokens  {out.text!r}")


show("max_tokens=8", llm.generate(prompt, SamplingParams(max_tokens=8, **greedy))[0])
show('stop="execution"',
     llm.generate(prompt, SamplingParams(max_tokens=60, stop="execution", **greedy))[0])
for_id = tok.tok.token_to_id("Ġfor")
show(f"stop_token_ids=[{for_id}] (' for')",
     llm.generate(prompt, SamplingParams(max_tokens=60, stop_token_ids=[for_id], **greedy))[0])
short = LLM(dtype="float32", max_model_len=10)
show("max_model_len=10", short.generate(prompt, SamplingParams(max_tokens=None, **greedy))[0])

# %% [markdown]
# The stop string is cut from the text (the tokens that spelled it stay in `token_ids`), while
# a stop token's text is kept. The order matters when two rules fire on the same token: with
# `max_tokens` set to exactly the position of " for", the stop token still wins.

# %%
at = engine.token_ids.index(for_id) + 1
out = llm.generate(prompt, SamplingParams(max_tokens=at, stop_token_ids=[for_id], **greedy))[0]
show(f"both rules at token {at}", out)
assert out.finish_reason == "stop"

# %% [markdown]
# An EOS token ends a reply the same way, unless `ignore_eos=True`. The model was trained with
# EOS after every topic, so its probability rises where a topic of the manual ends. Here are
# the EOS probabilities at the last position of a topic's end vs mid-sentence:

# %%
from pydoc_data.topics import topics  # noqa: E402

end_of_topic = tok.encode(topics["while"].strip()[-200:] + "\n")
mid_sentence = tok.encode(prompt)
with torch.inference_mode():
    for label, seq in [("end of the 'while' topic", end_of_topic), ("mid-sentence", mid_sentence)]:
        h = model(torch.tensor([seq]), torch.arange(len(seq))[None])
        p = model.compute_logits(h[0, -1]).softmax(-1)[1].item()
        print(f"P(EOS) after {label:<26} {p:.3f}")

# %% [markdown]
# ## 5. Refusals at the door
#
# Bad inputs are `ValueError`s raised before any work starts, naming what is wrong.

# %%
for bad in [lambda: SamplingParams(temperature=-1),
            lambda: SamplingParams(max_tokens=0),
            lambda: llm.generate([[5, 9, 4096]], SamplingParams())]:
    try:
        bad()
    except ValueError as e:
        print("ValueError:", e)

# %% [markdown]
# ## 6. What the shipped model knows
#
# The training log says how many parameters the model has for each token it trained on, and
# how many times it went over its text; both are printed below. With that much capacity per
# token it recites a topic it trained on, and on a prompt the manual does not continue it
# produces plausible, wrong text. Its loss on the first 256 tokens of a topic it trained on
# ("try") and of a held-out one ("import") shows the same gap as the training log.

# %%
for p in ['The "while" statement is used', "Exceptions are"]:
    out = llm.generate(p, SamplingParams(temperature=0, max_tokens=24))[0]
    print(f"{p!r} -> {out.text!r}\n")

log = json.loads((ROOT / "nanoserve/checkpoints/nanoserve-tiny/train_log.json").read_text())
print(f"train_log.json: final training loss {log['final_train_loss']:.2f}, "
      f"validation loss {log['val_loss']:.2f}")
passes = log["steps"] * log["batch"] * log["seq_len"] / log["train_tokens"]
print(f"{log['parameters'] / log['train_tokens']:.1f} parameters per training token, "
      f"{passes:.1f} passes over the training text")
with torch.inference_mode():
    for name, held_out in [("try", False), ("import", True)]:
        seq = tok.encode(topics[name].strip())[:256]
        x = torch.tensor([seq])
        logits = model.compute_logits(model(x, torch.arange(len(seq))[None]))[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, x[0, 1:]).item()
        print(f"topic {name!r:<11} ({'held out' if held_out else 'trained on'}): "
              f"loss {loss:.2f} over {len(seq)} tokens")

print(f"\nnotebook ran in {time.perf_counter() - t_start:.1f} s")

"""Train nanoserve-tiny: the small Llama the repository ships, so the engine has a real model.

Why this script exists: no model hub is reachable from the machines that build and test nanoserve,
and random weights print noise. So the project trains its own few-million-parameter Llama on text
that ships with every Python install (``pydoc_data.topics``, the reference manual behind
``help()``), with a byte-level BPE tokenizer trained on the same text, and writes the result in
the Hugging Face folder layout the engine loads. Everything is seeded: the same command on the
same torch build gives the same weights.

    python tools/train_tiny.py --out nanoserve/checkpoints/nanoserve-tiny --steps 600

Every 10th topic (sorted by name) is held out; the validation loss is measured on those. The
split and the loss live in ``nanoserve.model.text_loss``, which quantization's quality checks share.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from nanoserve.config import ModelConfig
from nanoserve.model.llama import Llama
from nanoserve.model.text_loss import corpus, encode_stream, evaluate, loss_of
from nanoserve.model.weights import save_checkpoint

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# ChatML's layout (<|im_start|>role ... <|im_end|>) with Qwen 2.5's Hermes tools (a system block
# listing the tools inside <tools></tools>, calls as <tool_call>{...}</tool_call>, results in a
# user turn as <tool_response>...</tool_response>), this project's text; without tools it renders
# as the plain ChatML layout always did. The markers are plain text to this vocabulary (it has no
# token for them), and the model never saw a chat: the template lets chat clients talk to it, and
# tool-calling clients call it, not chat well. It is nanoserve.testing's qwen2 template behind a
# BOS (tests/test_chat_render.py holds the three copies equal).
CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if tools %}\n"
    "{{- '<|im_start|>system\\n' }}\n"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}\n"
    "{{- '# Tools\\n\\nYou can call the functions below to help with the request.\\n\\n"
    "Their signatures, one JSON object a line, are inside <tools></tools>:\\n<tools>' }}\n"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}\n"
    "{{- '\\n</tools>\\n\\nTo call a function, answer with a JSON object holding its name and "
    "its arguments inside <tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}\n"
    "{%- set turns = messages[1:] if messages and messages[0]['role'] == 'system' "
    "else messages %}\n"
    "{%- else %}{%- set turns = messages %}{%- endif %}\n"
    "{%- for message in turns %}\n"
    "{%- if message['role'] == 'tool' %}\n"
    "{%- if loop.first or turns[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}\n"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}\n"
    "{%- if loop.last or turns[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}\n"
    "{%- else %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}\n"
    "{{- message['content'] }}\n"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] %}\n"
    "{%- for call in message['tool_calls'] %}\n"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}\n"
    "{{- '<tool_call>\\n' }}\n"
    "{%- set fn = call['function'] if call['function'] is defined else call %}\n"
    "{{- '{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}\n"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}"
    "{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}\n"
    "{{- '}' }}\n"
    "{{- '\\n</tool_call>' }}\n"
    "{%- endfor %}\n"
    "{%- endif %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")


def train_tokenizer(docs: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, EOS], min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    return tok


def batches(stream: torch.Tensor, seq_len: int, batch: int, gen: torch.Generator):
    while True:
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
        x = torch.stack([stream[s:s + seq_len] for s in starts.tolist()])
        y = torch.stack([stream[s + 1:s + seq_len + 1] for s in starts.tolist()])
        yield x, y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="nanoserve/checkpoints/nanoserve-tiny")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=2048)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)  # fixed, so the reduction order (and the weights) are reproducible
    train_docs, val_docs = corpus()
    tok = train_tokenizer(train_docs, args.vocab)
    train_stream, val_stream = encode_stream(tok, train_docs), encode_stream(tok, val_docs)
    print(f"tokens: train {len(train_stream):,}  val {len(val_stream):,}")

    cfg = ModelConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=688,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=0, eos_token_ids=(1,))
    model = Llama(cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * cfg.num_hidden_layers) if name.endswith(
                ("o_proj.weight", "down_proj.weight")) else 0.02
            torch.nn.init.normal_(p, std=std)
    print(f"parameters: {model.num_parameters():,}")

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    gen = torch.Generator().manual_seed(args.seed)
    data = batches(train_stream, args.seq_len, args.batch, gen)
    history, t0 = [], time.time()
    model.train()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(step / warmup, 0.1 + 0.9 * 0.5 * (1 + math.cos(
            math.pi * min(1.0, (step - warmup) / max(1, args.steps - warmup)))))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = next(data)
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        history.append(loss.item())
        if step % 50 == 0 or step == 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  lr {lr:.2e}  "
                  f"{time.time() - t0:6.0f}s", flush=True)
    model.eval()
    val_loss = evaluate(model, val_stream, args.seq_len)
    out = Path(args.out)
    save_checkpoint(model, cfg, out, dtype=torch.float32)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "add_bos_token": True, "model_max_length": cfg.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 1}, indent=2) + "\n")
    log = {
        "seed": args.seed, "steps": args.steps, "batch": args.batch, "seq_len": args.seq_len,
        "lr": args.lr, "parameters": model.num_parameters(),
        "train_tokens": len(train_stream), "val_tokens": len(val_stream),
        "final_train_loss": round(sum(history[-50:]) / len(history[-50:]), 4),
        "val_loss": round(val_loss, 4), "seconds": round(time.time() - t0),
        "torch": torch.__version__, "python": sys.version.split()[0],
        "loss_every_50": [round(v, 4) for v in history[::50]],
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(json.dumps({k: v for k, v in log.items() if k != "loss_every_50"}))


if __name__ == "__main__":
    main()

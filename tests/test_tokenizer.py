"""Tokenizer: BOS/EOS from the checkpoint files, streaming text, and the chat template,
each held against transformers' own tokenizer on the same folder."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from nanoserve.tokenizer import IncrementalDetokenizer, Tokenizer

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>"]
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('unknown role ' + message['role']) }}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
TEXT = ("The quick brown fox jumps over the lazy dog. Naïve café déjà vu, 日本語のテキスト, "
        "emoji 🙂🚀 and math ∑∫√. ") * 20


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A byte-level BPE in the Llama 3 layout: BOS added by the post-processor, 3 EOS ids."""
    d = tmp_path_factory.mktemp("tok")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 4]}))
    return d


def test_encode_matches_transformers(tok_dir):
    from transformers import AutoTokenizer

    ours, ref = Tokenizer.from_dir(tok_dir), AutoTokenizer.from_pretrained(tok_dir)
    for text in ["Hello world", TEXT[:200], " leading space", "a\n\nb"]:
        assert ours.encode(text) == ref(text)["input_ids"]
        assert ours.encode(text)[0] == 0  # BOS exactly once
        assert ours.decode(ours.encode(text)) == text


def test_add_bos_token_flag_adds_bos_once(tmp_path, tok_dir):
    raw = HFTokenizer.from_file(str(tok_dir / "tokenizer.json"))
    raw.post_processor = None
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<|begin_of_text|>"}, "add_bos_token": True}))
    ids = Tokenizer.from_dir(tmp_path).encode("Hello")
    assert ids[0] == 0 and ids.count(0) == 1


def test_eos_ids_come_from_generation_config(tok_dir):
    assert Tokenizer.from_dir(tok_dir).eos_token_ids == (1, 4)


def test_incremental_detokenizer_never_splits_a_character(tok_dir):
    tok = Tokenizer.from_dir(tok_dir)
    unseen = "Ωmega 🦀 crab, ☃ snow, 𝔘nicode — and café 🙂 again."  # mostly unseen: byte tokens
    ids = tok.encode(unseen, add_special_tokens=False)
    multibyte = [i for i in ids if "\ufffd" in tok.decode([i])]
    assert multibyte, "the test text must contain tokens that are partial characters"
    det = IncrementalDetokenizer(tok, prompt_ids=[0])
    deltas = [det.push(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == det.text == tok.decode(ids)
    assert "" in deltas  # some pushes had to wait for the rest of a character


def test_chat_template_matches_transformers(tok_dir):
    from transformers import AutoTokenizer

    ours, ref = Tokenizer.from_dir(tok_dir), AutoTokenizer.from_pretrained(tok_dir)
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "  What is a café?  "}]
    for gen in (True, False):
        assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == \
            ref.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)
        assert ours.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=True) == \
            ref.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=True,
                                    return_dict=False)


def test_chat_template_errors_are_value_errors(tok_dir, tmp_path):
    tok = Tokenizer.from_dir(tok_dir)
    with pytest.raises(ValueError, match="unknown role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])
    (tmp_path / "tokenizer.json").write_text((tok_dir / "tokenizer.json").read_text())
    with pytest.raises(ValueError, match="no chat_template"):
        Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("template,words", [
    ("{% for m in messages %}{{ m['content'] }{% endfor %}", "does not parse: line 1"),
    ("{{ no_such_function() }}", "UndefinedError"),
    ("{{ 'a' + 1 }}", "TypeError"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "chat template failed"),  # the sandbox
    ("{{ raise_exception('System role not supported') }}", "System role not supported"),
])
def test_every_template_failure_is_a_value_error_that_says_which(tok_dir, template, words):
    tok = Tokenizer.from_dir(tok_dir)
    tok.chat_template = template
    with pytest.raises(ValueError, match=words):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_strftime_now_and_the_special_tokens_reach_the_template(tok_dir):
    from datetime import datetime

    tok = Tokenizer.from_dir(tok_dir)
    tok.chat_template = "{{ bos_token }}{{ strftime_now('%Y') }}{{ eos_token }}"
    year = datetime.now().strftime("%Y")
    assert tok.apply_chat_template([]) == f"<|begin_of_text|>{year}<|eot_id|>"

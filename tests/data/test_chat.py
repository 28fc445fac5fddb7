"""Chat templates rendered one way in training and evaluation (TRL's convention), against three template styles.

The tokenizers are built here from scratch (character level, the templates' markers as special tokens) with
simplified but faithful Llama-3, ChatML (Qwen) and Gemma templates: the traps are a second BOS (a template that
writes ``bos_token`` tokenized with special tokens added again) and a completion ending in ``eos`` instead of the
template's end of turn (TRL #4481, axolotl #1616).
"""

from __future__ import annotations

import logging
import string

import pytest
import torch

from prefzoo.data import chat
from prefzoo.data.formats import DataFormatError

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
STYLES = {
    # name: (template, bos, eos, markers, the assistant turn the template renders for "Paris")
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>", ["<|start_header_id|>", "<|end_header_id|>"],
               "Paris<|eot_id|>"),
    "chatml": (CHATML, None, "<|im_end|>", ["<|im_start|>", "<|endoftext|>"], "Paris<|im_end|>\n"),
    "gemma": (GEMMA, "<bos>", "<eos>", ["<start_of_turn>", "<end_of_turn>"], "Paris<end_of_turn>\n"),
}  # fmt: skip
CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]


def build_chat_tokenizer(style: str, template: bool = True):
    """A character tokenizer whose chat markers are single special tokens; BOS added on plain calls if it has one."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tpl, bos, eos, markers, _ = STYLES[style]
    specials = [t for t in ("<pad>", "<unk>", bos, eos, *markers) if t]
    vocab = {t: i for i, t in enumerate([*specials, *string.printable])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.add_special_tokens(specials)
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # newlines too
    tk.decoder = decoders.Fuse()
    if bos:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])]
        )
    extra = [t for t in markers if t not in (bos, eos)]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=bos, eos_token=eos, pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=extra, name_or_path=f"local-{style}-{template}",
    )  # fmt: skip
    tok.chat_template = tpl if template else None
    return tok


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_conversation_renders_as_the_template_renders_it(style):
    tok = build_chat_tokenizer(style)
    _, bos, eos, _, turn = STYLES[style]
    prompt = chat.render_prompt(tok, CONV)
    completion = chat.render_completion(tok, CONV, "Paris")
    whole = tok.apply_chat_template([*CONV, {"role": "assistant", "content": "Paris"}], tokenize=True)
    whole = list(whole["input_ids"] if hasattr(whole, "input_ids") or isinstance(whole, dict) else whole)
    assert prompt + completion == whole  # exactly the template's own rendering of the whole conversation
    assert tok.decode(completion, skip_special_tokens=False) == turn
    if bos:
        assert prompt.count(tok.bos_token_id) == 1 and prompt[0] == tok.bos_token_id  # no second BOS
    assert completion.count(tok.eos_token_id) == turn.count(eos)  # no eos appended after the end of turn
    assert tok.decode(prompt, skip_special_tokens=False).endswith(
        {"llama3": "assistant<|end_header_id|>\n\n", "chatml": "<|im_start|>assistant\n", "gemma": "model\n"}[style]
    )


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_string_prompt_is_used_as_given_even_with_a_template(style):
    tok = build_chat_tokenizer(style)
    templated = tok.apply_chat_template(CONV, add_generation_prompt=True, tokenize=False)
    assert chat.render_prompt(tok, templated) == list(tok(templated).input_ids)  # not wrapped, not templated again
    assert chat.render_prompt(tok, "2+2=") == list(tok("2+2=").input_ids)
    assert chat.render_completion(tok, "2+2=", "4") == [*tok("4", add_special_tokens=False).input_ids, tok.eos_token_id]
    assert chat.render_completion(tok, CONV, "  ") == []


def test_a_tokenizer_without_a_template_warns_once_and_says_how_to_give_one(caplog):
    tok = build_chat_tokenizer("chatml", template=False)
    with caplog.at_level(logging.WARNING, logger="prefzoo.data.chat"):
        first = chat.render_prompt(tok, CONV)
        chat.render_prompt(tok, CONV)
        chat.render_completion(tok, CONV, "Paris")
    warnings = [r for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(warnings) == 1 and "--chat-template" in warnings[0].getMessage()
    assert tok.decode(first) == "Be brief.\n\nCapital of France?"


def test_chat_template_option(tmp_path):
    tok = build_chat_tokenizer("chatml")
    assert chat.set_chat_template(tok, "auto") == "the tokenizer's own"
    path = tmp_path / "gemma.jinja"
    path.write_text(GEMMA.replace("<start_of_turn>", "<|im_start|>").replace("<end_of_turn>", "<|im_end|>"))
    assert str(path) in chat.set_chat_template(tok, str(path))
    assert tok.decode(chat.render_prompt(tok, [CONV[1]]), skip_special_tokens=False).endswith("<|im_start|>model\n")
    with pytest.raises(DataFormatError, match=r"--chat-template .*nope\.jinja: no such file"):
        chat.set_chat_template(tok, str(tmp_path / "nope.jinja"))
    assert chat.set_chat_template(tok, "none").startswith("none")
    assert not chat.has_chat_template(tok)


class _SpyLM(torch.nn.Module):
    """A causal LM stand-in that records what generate() is given and answers with one eos."""

    def __init__(self, eos: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.eos, self.seen = eos, []

    def generate(self, input_ids, attention_mask, **kw):
        self.seen += [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask, strict=True)]
        return torch.cat([input_ids, torch.full((len(input_ids), 1), self.eos)], dim=1)


@pytest.mark.parametrize("style", ["llama3", "chatml"])
def test_win_rate_generation_sees_the_prompt_tokens_training_saw(style):
    import datasets

    from prefzoo.data.tokenize import tokenize_pairs
    from prefzoo.judge.generation import generate

    tok = build_chat_tokenizer(style)
    rows = [
        {"id": "a", "prompt": CONV, "chosen": "Paris", "rejected": "Lyon"},
        {"id": "b", "prompt": "<|im_start|>user\nhi<|im_end|>\n", "chosen": "hello", "rejected": "bye"},
        {"id": "c", "prompt": [{"role": "user", "content": "Longer question here?"}], "chosen": "x", "rejected": "y"},
    ]
    enc, _ = tokenize_pairs(datasets.Dataset.from_list(rows[:1] + rows[2:]), tok)  # one format per dataset
    enc_plain, _ = tokenize_pairs(datasets.Dataset.from_list(rows[1:2]), tok)
    spy = _SpyLM(tok.eos_token_id)
    generate(spy, tok, [r["prompt"] for r in rows], max_new_tokens=1, batch_size=3)
    assert spy.seen == [enc[0]["prompt_ids"], enc_plain[0]["prompt_ids"], enc[1]["prompt_ids"]]

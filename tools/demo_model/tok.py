"""Byte-level BPE tokenizer with chat special tokens, plus the chat template.

Layout of a rendered chat (no newlines anywhere, so template whitespace options never matter):

    <|bos|><|system|>SYSTEM<|eot|><|user|>QUESTION<|eot|><|assistant|>ANSWER<|eot|>...

`<|eot|>` ends every turn and is the tokenizer's eos, so generation stops at the end of the
assistant's turn. The template inserts the default system prompt when the chat has none.
"""

import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from corpus import DEFAULT_SYSTEM

PAD, BOS, EOT = "<|pad|>", "<|bos|>", "<|eot|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
# Fixed ids 0..5: the BPE trainer assigns special tokens first, in this order.
SPECIALS = [PAD, BOS, EOT, ROLE_TOKENS["system"], ROLE_TOKENS["user"], ROLE_TOKENS["assistant"]]
PAD_ID, BOS_ID, EOT_ID = 0, 1, 2
ROLE_IDS = {"system": 3, "user": 4, "assistant": 5}

# Only plain Jinja (loops, item access, `not`, comparison) so that minijinja 2 renders it the
# same as Python's jinja2. Roles outside system/user/assistant render as plain text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if not messages or messages[0]['role'] != 'system' %}"
    "<|system|>" + DEFAULT_SYSTEM + "{{ eos_token }}"
    "{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def render(messages, add_generation_prompt=False):
    """Python mirror of CHAT_TEMPLATE (checked against the real renderer in run_all)."""
    out = [BOS]
    if not messages or messages[0]["role"] != "system":
        out.append(ROLE_TOKENS["system"] + DEFAULT_SYSTEM + EOT)
    for m in messages:
        out.append("<|{}|>{}{}".format(m["role"], m["content"], EOT))
    if add_generation_prompt:
        out.append(ROLE_TOKENS["assistant"])
    return "".join(out)


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    # Single digits keep order numbers and prices copyable digit by digit.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    # encode(text, add_special_tokens=True) prepends <|bos|>, like Llama tokenizers.
    tok.post_processor = processors.TemplateProcessing(
        single=BOS + " $A", pair=BOS + " $A " + BOS + " $B", special_tokens=[(BOS, BOS_ID)])
    return tok


def save_tokenizer(tok, folder, max_len):
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": PAD,
        "unk_token": None,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

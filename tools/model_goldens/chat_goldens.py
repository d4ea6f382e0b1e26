#!/usr/bin/env python3
"""Goldens for the chat templates in tests/fixtures/chat_templates: what transformers'
apply_chat_template renders (its `render_jinja_template`, with the special tokens of each model's
tokenizer_config.json, as apply_chat_template passes them) for a set of conversations, with and
without the generation prompt. A conversation the template refuses (raise_exception) records the
message instead. tests/chat_templates.rs renders the same with brook's minijinja environment.

Usage: python tools/model_goldens/chat_goldens.py [--dir tests/fixtures/chat_templates]
"""

import argparse
import json
import pathlib

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

# The special tokens each model's tokenizer_config.json defines (None: not set).
SPECIAL = {
    "Llama-3.1-8B-Instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "Mistral-Nemo-Instruct-2407": {"bos_token": "<s>", "eos_token": "</s>"},
    "Phi-3.5-mini-instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "Qwen2.5-7B-Instruct": {"bos_token": None, "eos_token": "<|im_end|>"},
    "Qwen3-0.6B": {"bos_token": None, "eos_token": "<|im_end|>"},
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is a brook?"},
    ],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Good morning"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "And good night?"},
    ],
    [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "1, 2, 3"},
    ],
    [
        {"role": "user", "content": "  spaces and\nnew lines \n"},
        {"role": "assistant", "content": "\u00fcnic\u00f6de \u2713 \U0001f642 <b>&amp;</b>"},
        {"role": "user", "content": "{{ not a template }} {% raw %}"},
    ],
    # Roles out of order: some templates raise, others render.
    [
        {"role": "assistant", "content": "I speak first."},
        {"role": "user", "content": "Fine."},
    ],
    [
        {"role": "user", "content": "One."},
        {"role": "user", "content": "Two."},
    ],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="tests/fixtures/chat_templates")
    args = ap.parse_args()
    d = pathlib.Path(args.dir)
    out = {"transformers": transformers.__version__, "templates": {}}
    for name, special in sorted(SPECIAL.items()):
        template = (d / f"{name}.jinja").read_text()
        kwargs = {k: v for k, v in special.items() if v is not None}
        cases = []
        for conv in CONVERSATIONS:
            for gen in (True, False):
                case = {"messages": conv, "add_generation_prompt": gen}
                try:
                    rendered, _ = render_jinja_template(
                        conversations=[conv],
                        chat_template=template,
                        add_generation_prompt=gen,
                        **kwargs,
                    )
                    case["rendered"] = rendered[0]
                except Exception as e:  # the template's raise_exception
                    case["error"] = str(e)
                cases.append(case)
        out["templates"][name] = {"special_tokens": special, "cases": cases}
        print(name, sum("error" in c for c in cases), "refused of", len(cases))
    (d / "goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

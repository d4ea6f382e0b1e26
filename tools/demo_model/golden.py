"""Golden greedy outputs for brook's tests, and the end-of-turn check on held-out questions.

Both run on the EXPORTED folders loaded as float32 (bf16 weights upcast), which is what brook's
CPU engine computes. Goldens run on the CPU with eager attention so that they do not depend
on GPU kernels.
"""

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

import tok

MAX_NEW = 48

# Raw prompts: encoded with add_special_tokens=True, so the ids start with <|bos|>.
PROMPTS = [
    ("returns_article", "Returns at Brook Market. You can return unused items within"),
    ("shipping_article", "Brook Market shipping policy. Standard shipping takes"),
    ("product_blurb", "The Aurora rain jacket has"),
    ("payment_article", "Payment methods. Brook Market accepts"),
    ("tracking_article", "How to track your order. Once your order ships,"),
    ("contact_article", "Contact Brook Market. Our support team is available"),
    ("order_sentence", "Order #4829103 shipped on"),
    ("greeting_word", "Hello"),
    ("question_text", "Can I return my hiking boots?"),
    ("refund_sentence", "Refunds are issued within"),
    ("fit_blurb", "The Summit hiking boots"),
    ("gift_card_sentence", "Digital gift cards from"),
]

SHOP_SYSTEM = ("You are Maya, a customer-support agent at Kestrel Sports, an online store for "
               "running and fitness gear. Returns are accepted within 30 days of delivery. "
               "Keep answers short and friendly.")

# Chats: rendered with add_generation_prompt=True and encoded with add_special_tokens=False
# (the template itself writes <|bos|>).
CHATS = [
    ("where_is_order", [{"role": "user", "content": "Where is my order?"}]),
    ("return_shoes", [{"role": "user", "content":
                       "Hi, I'd like to return my running shoes because they don't fit."}]),
    ("colour_question", [{"role": "system", "content": SHOP_SYSTEM},
                         {"role": "user", "content": "Does the Nova hoodie come in black?"}]),
    ("card_declined", [{"role": "user", "content": "My card keeps getting declined."}]),
    ("manager", [{"role": "user", "content": "Can I speak to a manager?"}]),
    ("multi_turn_order", [
        {"role": "user", "content": "Has my order shipped yet?"},
        {"role": "assistant", "content": "Could you share your order number?"},
        {"role": "user", "content": "It's 4417302."}]),
    ("shipping_cost", [{"role": "user", "content": "How much is shipping?"}]),
    ("double_charge", [{"role": "system", "content": SHOP_SYSTEM},
                       {"role": "user", "content": "I was charged twice for my order."}]),
    ("joke", [{"role": "user", "content": "Tell me a joke."}]),
    ("greeting", [{"role": "user", "content": "hello"}]),
    ("size_question", [{"role": "user", "content":
                        "What size should I get in the Atlas fleece jacket? I'm usually a M."}]),
    ("cancel", [{"role": "user", "content": "I want to cancel my order."}]),
    ("thanks_after_answer", [
        {"role": "user", "content": "How much is shipping?"},
        {"role": "assistant", "content":
         "Standard shipping takes 3-5 business days and costs $5.99, and it's free on orders "
         "over $50. Express shipping takes 1-2 business days for $12.99."},
        {"role": "user", "content": "Thanks!"}]),
    ("restock", [{"role": "system", "content": SHOP_SYSTEM},
                 {"role": "user", "content": "When will the Luna yoga mat be back in stock?"}]),
]

TOP5_CASES = ("returns_article", "product_blurb", "where_is_order", "multi_turn_order")


def load_f32(folder, device="cpu", attn="eager"):
    m = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                         attn_implementation=attn).to(device)
    m.eval()
    return m


@torch.no_grad()
def greedy(model, ids, max_new):
    """-> (new token ids, stopped on eos, top1-top2 logit gap at each generated step)."""
    x = torch.tensor([ids], device=model.device)
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                         do_sample=False, eos_token_id=tok.EOT_ID, pad_token_id=tok.PAD_ID,
                         return_dict_in_generate=True, output_logits=True)
    new = out.sequences[0, len(ids):].tolist()
    gaps = []
    for lg in out.logits:
        t2 = torch.topk(lg[0].float(), 2).values
        gaps.append((t2[0] - t2[1]).item())
    return new, bool(new and new[-1] == tok.EOT_ID), gaps


def chat_ids(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == tok.render(messages, add_generation_prompt=True)
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def golden_cases(folder, tokenizer):
    model = load_f32(folder)
    cases = []
    for name, prompt in PROMPTS:
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        assert ids[0] == tok.BOS_ID
        cases.append({"name": name, "kind": "prompt", "prompt": prompt,
                      "add_special_tokens": True, "prompt_token_ids": ids})
    for name, msgs in CHATS:
        text, ids = chat_ids(tokenizer, msgs)
        cases.append({"name": name, "kind": "chat", "messages": msgs,
                      "rendered": text, "add_special_tokens": False, "prompt_token_ids": ids})
    for c in cases:
        new, eos, gaps = greedy(model, c["prompt_token_ids"], MAX_NEW)
        c["output_token_ids"] = new
        c["stopped_on_eos"] = eos
        c["output_text"] = tokenizer.decode(new, skip_special_tokens=True)
        # a near-tie (small gap) can flip under a different float summation order
        c["min_top2_logit_gap"] = round(min(gaps), 5)
        c["top2_logit_gaps"] = [round(x, 4) for x in gaps]
        if c["name"] in TOP5_CASES:
            logits = model(input_ids=torch.tensor([c["prompt_token_ids"]])).logits[0, -1]
            v, i = torch.topk(logits.float(), 5)
            c["last_logits_top5"] = {"ids": i.tolist(), "values": [round(x, 5) for x in
                                                                   v.tolist()]}
    return cases


@torch.no_grad()
def end_of_turn_check(folder, tokenizer, questions, device, max_new=128):
    """Greedy replies to held-out questions, one at a time (no padding effects)."""
    model = load_f32(folder, device)
    out = []
    for msgs in questions:
        _, ids = chat_ids(tokenizer, msgs)
        new, eos, _ = greedy(model, ids, max_new)
        out.append({"messages": msgs, "reply": tokenizer.decode(new, skip_special_tokens=True),
                    "n_tokens": len(new), "ended_turn": eos})
    return out


def tokenizer_for(folder):
    return AutoTokenizer.from_pretrained(folder)

#!/usr/bin/env python3
"""Tiny random checkpoints of each model family brook runs, with transformers' greedy tokens and
logits as goldens (tests/fixtures/models/<family>/).

Each family gets a config that exercises what sets it apart (see src/model/arch.rs): Llama 3.x
RoPE scaling, Mistral's sliding window, Qwen2's q/k/v biases and tied embeddings, Qwen3's q/k
norms with an explicit head_dim, Phi-3's fused projections, longrope and sliding window. Weights
are re-drawn with scales that keep logits O(1) (transformers' 0.02 init makes them nearly flat,
so greedy picks would hang on rounding), saved as bf16 safetensors (small, and loaded exactly by
both sides), and the goldens come from the float32 model by full recomputation at every step
(no KV cache, eager attention: the plainest reading of the modeling code).

Usage: python tools/model_goldens/make_goldens.py [--out tests/fixtures/models]
Needs torch (CPU is enough) and transformers >= 4.51; the versions used are recorded in each
golden.json.
"""

import argparse
import copy
import json
import math
import pathlib

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

VOCAB = 256
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    hidden_act="silu",
)
# Prompt lengths: every family's longest prompt plus the generated tokens stays within Phi-3's
# original context of 64 (brook serves longrope only there).
PROMPT_LENS = [5, 23, 41]
NEW_TOKENS = 8


def families():
    half = 8  # head_dim 16 / 2
    return {
        "llama3": LlamaConfig(
            **COMMON,
            max_position_embeddings=256,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            ),
            tie_word_embeddings=False,
        ),
        "mistral": MistralConfig(
            **{**COMMON, "num_key_value_heads": 1},
            max_position_embeddings=256,
            rope_theta=10000.0,
            sliding_window=12,
            tie_word_embeddings=False,
        ),
        "qwen2": Qwen2Config(
            **COMMON,
            max_position_embeddings=256,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
            sliding_window=256,
            max_window_layers=2,
        ),
        "qwen3": Qwen3Config(
            **COMMON,
            head_dim=32,
            max_position_embeddings=256,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            attention_bias=False,
            use_sliding_window=False,
        ),
        "phi3": Phi3Config(
            **{**COMMON, "num_key_value_heads": 4},
            max_position_embeddings=256,
            original_max_position_embeddings=64,
            rope_theta=10000.0,
            rope_scaling=dict(
                type="longrope",
                short_factor=[1.0 + 0.25 * i for i in range(half)],
                long_factor=[2.0 + 0.5 * i for i in range(half)],
            ),
            sliding_window=20,
            tie_word_embeddings=False,
        ),
    }


def reinit(model, seed):
    """Linear weights ~ U with std 1/sqrt(fan_in), biases std 0.1, norms 1 +- 0.1 (std), embeddings
    std 0.1 (small enough that a tied lm_head does not just echo the input token): activations
    and logits of order one."""
    g = torch.Generator().manual_seed(seed)

    def uniform(shape, center, std):
        half_width = math.sqrt(3.0) * std
        return center + (torch.rand(shape, generator=g) * 2 - 1) * half_width

    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(uniform(p.shape, 1.0, 0.1))
            elif name.endswith(".bias"):
                p.copy_(uniform(p.shape, 0.0, 0.1))
            elif "embed_tokens" in name:
                p.copy_(uniform(p.shape, 0.0, 0.1))
            else:
                p.copy_(uniform(p.shape, 0.0, 1.0 / math.sqrt(p.shape[1])))
        # Round every weight to bf16 now, so the saved bf16 checkpoint holds exactly these values.
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def greedy(model, prompt):
    """Greedy tokens and the logits row each came from, recomputing the whole sequence each step."""
    seq = list(prompt)
    tokens, rows = [], []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([seq])).logits[0, -1].float()
            t = int(torch.argmax(logits))
            tokens.append(t)
            rows.append([round(float(x), 6) for x in logits])
            seq.append(t)
    return tokens, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/models")
    args = ap.parse_args()
    torch.manual_seed(0)
    for i, (name, cfg) in enumerate(families().items()):
        cfg._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
        reinit(model, 1000 + i)
        out = pathlib.Path(args.out) / name
        out.mkdir(parents=True, exist_ok=True)
        # A copy: .to(bfloat16) also rounds buffers such as RoPE's inv_freq, which the float32
        # model computing the goldens must keep.
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
        g = torch.Generator().manual_seed(2000 + i)
        prompts = [
            torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS
        ]
        cases = []
        for prompt in prompts:
            tokens, rows = greedy(model, prompt)
            cases.append({"prompt": prompt, "tokens": tokens, "logits": rows})
        golden = {
            "family": name,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "cases": cases,
        }
        (out / "golden.json").write_text(json.dumps(golden) + "\n")
        print(name, [c["tokens"] for c in cases])


if __name__ == "__main__":
    main()

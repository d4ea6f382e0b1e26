"""Hugging Face transformers batch-1 decode at its fastest: a StaticCache and a decode step under
torch.compile(mode="reduce-overhead", fullgraph=True) (CUDA graphs), random weights, greedy.
Prints one JSON line with the median ms/token.

    python3 bench/peers/hf_compiled_b1.py --model llama-2-7b --input-len 128 --output-len 256
"""
import argparse
import json
import time

import torch
import transformers
from transformers import StaticCache

from shapes import random_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="llama-2-7b")
ap.add_argument("--input-len", type=int, default=128)
ap.add_argument("--output-len", type=int, default=256)
args = ap.parse_args()

torch.manual_seed(0)
model = random_model(args.model)
cache = StaticCache(config=model.config, max_cache_len=args.input_len + args.output_len + 8)
prompt = torch.randint(3, model.config.vocab_size, (1, args.input_len), device="cuda")


def step(tok, pos):
    return model(tok, past_key_values=cache, cache_position=pos, position_ids=pos.unsqueeze(0), use_cache=True).logits


compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
with torch.no_grad():
    logits = model(prompt, past_key_values=cache, cache_position=torch.arange(args.input_len, device="cuda"), use_cache=True).logits
    tok = logits[:, -1:].argmax(-1)
    times = []
    for i in range(args.output_len - 1):
        pos = torch.tensor([args.input_len + i], device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tok = compiled(tok, pos)[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
warm = sorted(times[16:])
print(json.dumps({
    "figure": "hf_compiled_b1_ms_per_token", "model": args.model, "transformers": transformers.__version__,
    "torch": torch.__version__, "input_len": args.input_len, "output_len": args.output_len,
    "median_ms": warm[len(warm) // 2], "mean_ms": sum(warm) / len(warm),
}), flush=True)

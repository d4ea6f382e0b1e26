"""Hugging Face transformers continuous batching (`generate_batch`, paged|sdpa, CUDA graphs) on
random weights: N requests x input/output tokens, greedy, fixed output length. Prints one JSON line.

    python3 bench/peers/hf_generate_batch.py --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128
"""
import argparse
import json
import time

import torch
import transformers
from transformers import GenerationConfig
from transformers.generation import ContinuousBatchingConfig

from shapes import random_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="llama-2-7b")
ap.add_argument("--num-prompts", type=int, default=512)
ap.add_argument("--input-len", type=int, default=128)
ap.add_argument("--output-len", type=int, default=128)
ap.add_argument("--no-cuda-graph", action="store_true")
args = ap.parse_args()

torch.manual_seed(0)
model = random_model(args.model)
vocab = model.config.vocab_size
gen = GenerationConfig(max_new_tokens=args.output_len, do_sample=False, eos_token_id=None, pad_token_id=0)
cb = ContinuousBatchingConfig(use_cuda_graph=not args.no_cuda_graph)
inputs = [torch.randint(3, vocab, (args.input_len,)).tolist() for _ in range(args.num_prompts)]

# Warm-up on a slice (graph capture, kernels' first launches), then the timed run.
model.generate_batch(inputs[:32], generation_config=gen, continuous_batching_config=cb, progress_bar=False)
torch.cuda.synchronize()
t0 = time.perf_counter()
out = model.generate_batch(inputs, generation_config=gen, continuous_batching_config=cb, progress_bar=False)
torch.cuda.synchronize()
wall = time.perf_counter() - t0
generated = sum(len(o.generated_tokens) for o in out.values())
print(json.dumps({
    "figure": "hf_cb_out_tok_s", "model": args.model, "transformers": transformers.__version__, "torch": torch.__version__,
    "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
    "attn": model.config._attn_implementation, "use_cuda_graph": not args.no_cuda_graph,
    "wall_s": wall, "generated": generated, "output_tok_s": generated / wall,
}), flush=True)

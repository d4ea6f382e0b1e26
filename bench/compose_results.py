"""Builds bench/results/h200.json from one gpu-check run's JSON lines (brook.jsonl, peers.jsonl).

    python3 bench/compose_results.py OUTDIR COMMIT DATE > bench/results/h200.json
"""
import json
import sys

out_dir, commit, date = sys.argv[1:4]
figs = []
for name in ("brook.jsonl", "peers.jsonl"):
    try:
        with open(f"{out_dir}/{name}") as f:
            figs += [json.loads(line) for line in f if line.startswith("{")]
    except FileNotFoundError:
        pass


def find(figure, **kw):
    for f in figs:
        if f.get("figure") == figure and all(f.get(k) == v for k, v in kw.items()):
            return f
    return None


CMD = "cd .carry/cuda && ./gpu-check.sh device all   (built by scripts/gpu-check.sh build)"
res = {"device": "NVIDIA H200 (nvidia-h200 lease)", "commit": commit, "date": date, "command": CMD, "figures": {}}
F = res["figures"]
d = find("decode_b1_ms_per_token", model="llama-2-7b", cuda_graphs=True)
if d:
    F["decode_b1_ms_per_token"] = {"value": d["median_ms"], "command": "gpu-bench decode --model llama-2-7b", "detail": d}
d = find("decode_b1_ms_per_token", model="llama-2-7b", cuda_graphs=True, gemv=False)
if d:
    F["decode_b1_ms_per_token_cublas"] = {"value": d["median_ms"], "command": "gpu-bench decode --model llama-2-7b", "detail": d}
d = find("decode_b1_ms_per_token", model="llama-2-7b", cuda_graphs=False)
if d:
    F["decode_b1_ms_per_token_no_graphs"] = {"value": d["median_ms"], "command": "gpu-bench decode --model llama-2-7b", "detail": d}
o = find("offline_out_tok_s", model="llama-2-7b")
if o:
    F["offline_512x128x128_out_tok_s"] = {"value": o["output_tok_s"], "command": "gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128", "detail": o}
h = find("hf_cb_out_tok_s", model="llama-2-7b")
if h:
    F["hf_cb_512x128x128_out_tok_s"] = {"value": h["output_tok_s"], "command": "python3 peers/hf_generate_batch.py --model llama-2-7b", "detail": h}
if o and h:
    F["offline_vs_hf_cb"] = {"value": o["output_tok_s"] / h["output_tok_s"]}
c = find("hf_compiled_b1_ms_per_token", model="llama-2-7b")
if c:
    F["hf_compiled_b1_ms_per_token"] = {"value": c["median_ms"], "command": "python3 peers/hf_compiled_b1.py --model llama-2-7b", "detail": c}
t = find("ttft_b1_ms", model="llama-2-7b")
if t:
    F["ttft_b1_2048_ms"] = {"value": t["median_ms"], "command": "gpu-bench ttft --model llama-2-7b --input-len 2048", "detail": t}
a = find("paged_decode_attention")
if a:
    F["paged_decode_attention"] = {"value": [{k: r[k] for k in ("ctx", "batch", "gbps", "pct_of_4300")} for r in a["rows"]], "command": "gpu-bench attention", "detail": a}
p = find("prefill_attention")
if p:
    F["prefill_attention"] = {"value": p["rows"], "command": "gpu-bench attention"}
json.dump(res, sys.stdout, indent=1)
print()

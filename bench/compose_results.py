"""Builds bench/results/h200.json from gpu-check runs' JSON lines: brook's figures from one run,
the transformers peers from one run (the same run when both were measured together).

    python3 bench/compose_results.py BROOK_DIR BROOK_COMMIT BROOK_DATE [PEERS_DIR PEERS_COMMIT PEERS_DATE]
"""
import json
import sys

out_dir, commit, date = sys.argv[1:4]
peers_dir, peers_commit, peers_date = sys.argv[4:7] if len(sys.argv) >= 7 else (out_dir, commit, date)


def read(path, run):
    try:
        with open(path) as f:
            return [dict(json.loads(line), run=run) for line in f if line.startswith("{")]
    except FileNotFoundError:
        return []


figs = read(f"{out_dir}/brook.jsonl", {"commit": commit, "date": date})
# `brook bench --json` reports (no "figure" key): tagged here by their workload.
for r in read(f"{out_dir}/brook-bench.jsonl", {"commit": commit, "date": date}):
    r["figure"] = f"brook_bench_{r['num_prompts']}x{r['input_len']}x{r['output_len']}"
    figs.append(r)
figs += read(f"{peers_dir}/peers.jsonl", {"commit": peers_commit, "date": peers_date})


def find(figure, **kw):
    for f in figs:
        if f.get("figure") == figure and all(f.get(k) == v for k, v in kw.items()):
            return f
    return None


def rows(figure):
    return [f for f in figs if f.get("figure") == figure]


CMD = "cd .carry/cuda && ./gpu-check.sh device all   (built by scripts/gpu-check.sh build)"
res = {"device": "NVIDIA H200 (nvidia-h200 lease)", "commit": commit, "date": date, "command": CMD, "figures": {}}
F = res["figures"]
DECODE = "gpu-bench decode --model llama-2-7b"


def put(name, figure, field, command, **kw):
    """F[name]: `field` of the first `figure` row matching `kw`, with its command and the row;
    returns the row (None when there is none)."""
    f = find(figure, **kw)
    if f:
        F[name] = {"value": f[field], "command": command, "detail": f}
    return f


put("decode_b1_ms_per_token", "decode_b1_ms_per_token", "median_ms", DECODE, model="llama-2-7b", cuda_graphs=True, gemv=True, gemv_split=0, fused=False, pdl=True, skipped="")
put("decode_b1_ms_per_token_cublas", "decode_b1_ms_per_token", "median_ms", DECODE, model="llama-2-7b", cuda_graphs=True, gemv=False)
put("decode_b1_ms_per_token_no_graphs", "decode_b1_ms_per_token", "median_ms", DECODE, model="llama-2-7b", cuda_graphs=False)
o = put("offline_512x128x128_out_tok_s", "offline_out_tok_s", "output_tok_s", "gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128", model="llama-2-7b")
h = put("hf_cb_512x128x128_out_tok_s", "hf_cb_out_tok_s", "output_tok_s", "python3 peers/hf_generate_batch.py --model llama-2-7b", model="llama-2-7b")
if o and h:
    F["offline_vs_hf_cb"] = {"value": o["output_tok_s"] / h["output_tok_s"]}
put("hf_compiled_b1_ms_per_token", "hf_compiled_b1_ms_per_token", "median_ms", "python3 peers/hf_compiled_b1.py --model llama-2-7b", model="llama-2-7b")
put("ttft_b1_2048_ms", "ttft_b1_ms", "median_ms", "gpu-bench ttft --model llama-2-7b --input-len 2048", model="llama-2-7b")
a = find("paged_decode_attention")
if a:
    F["paged_decode_attention"] = {"value": [{k: r[k] for k in ("ctx", "batch", "gbps", "pct_of_4300")} for r in a["rows"]], "command": "gpu-bench attention", "detail": a}
p = find("prefill_attention")
if p:
    F["prefill_attention"] = {"value": p["rows"], "command": "gpu-bench attention"}
for name, figure in [("brook_bench_synthetic_512x128x128", "brook_bench_512x128x128"), ("brook_bench_synthetic_1x128x256", "brook_bench_1x128x256")]:
    b = find(figure)
    if b:
        F[name] = {"value": b["output_tok_s"], "unit": "out tok/s", "command": f"brook bench --synthetic llama-2-7b --device cuda --num-prompts {b['num_prompts']} --input-len {b['input_len']} --output-len {b['output_len']} (gpu-check.sh)", "detail": b}
for split in (1, 2, 4):
    put(f"decode_b1_ms_per_token_split{split}", "decode_b1_ms_per_token", "median_ms", DECODE, model="llama-2-7b", cuda_graphs=True, gemv_split=split, fused=False, pdl=True)
put("decode_b1_ms_per_token_no_pdl", "decode_b1_ms_per_token", "median_ms", DECODE, model="llama-2-7b", cuda_graphs=True, pdl=False)
put("decode_b1_ms_per_token_fused", "decode_b1_ms_per_token", "median_ms", DECODE, model="llama-2-7b", cuda_graphs=True, gemv_split=0, fused=True, pdl=True)
sk = [f for f in rows("decode_b1_ms_per_token") if f.get("skipped")]
if sk:
    F["decode_b1_ms_per_token_without"] = {"value": [{"skipped": f["skipped"], "median_ms": f["median_ms"]} for f in sk], "command": DECODE, "note": "the default with that kind of launch left out of every layer (output meaningless): what the kind costs in the step"}
g = rows("gemv_b1")
if g:
    F["gemv_b1"] = {"value": [{k: r.get(k) for k in ("model", "layer", "variant", "auto", "us", "gbps")} for r in g], "command": "gpu-bench gemv-sweep"}
x = rows("prefill_attn_crossover")
if x:
    F["prefill_attn_crossover"] = {"value": x, "command": "gpu-bench prefill-attn"}
json.dump(res, sys.stdout, indent=1)
print()

#!/usr/bin/env python3
"""Measured against predicted step time on a real run (issue 19), from brook's debug log.

Reads the per-run server logs that `scripts/slo-gpu.sh device` packs into runs.tgz (every step's
`step time` line: measured and predicted ms and the step's shape; every `merge decision` line)
and answers three questions:

1. Where is the linear step-time model wrong? Steps binned by shape (decode rows, the largest
   prefill chunk, that chunk's context), mean measured against mean predicted (the online fit the
   server used), and against two least-squares fits over all the steps: the linear model
   (`cost_model.rs`, five features) and the same with its sixth, the wave floor on the prefill
   attention (`prefill_floor_pairs`: a chunk of q < Q queries at context c costs about the pairs
   of max(q, min(Q, c)) queries, the kernel having no split over the keys; the feature is the
   pairs the padding adds, with its own coefficient; brook's ATTN_FLOOR_QUERIES is the Q that
   fits call e best).
2. How often did the ITL guard trim or refuse a chunk, per lane?
3. What did the long documents wait on: per long request, its first merge decision to its last
   granted chunk (its prefill's span), and the decisions that held it (refused for a decode's
   ITL, the long lane's budget); and per run the GPU's busy fraction and the seconds a second
   spent in steps carrying a document chunk.

Usage: scripts/step_times.py RUNS_DIR_OR_TGZ [--floor 512] [--json OUT]
The step shape is logged per step, not per chunk: the context of the largest chunk is taken as
attn_pairs / max_chunk + max_chunk / 2, exact when the step has one chunk and within the short
prompts' few hundred pairs otherwise (a 45-token prompt adds ~1k pairs to a chunk's millions).
"""

import argparse
import json
import os
import re
import sys
import tarfile
import tempfile
from collections import defaultdict

import numpy as np

ANSI = re.compile(r"\x1b\[[0-9;]*m")
KV = re.compile(r"(\w+)=(\"[^\"]*\"|\S+)")


def fields(line):
    return {k: v.strip('"') for k, v in KV.findall(line)}


def timestamp(line):
    # 2026-12-03T11:41:57.742131Z
    t = line.split(" ", 1)[0]
    h, m, s = t[11:-1].split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def pairs(q, ctx):
    return q * (ctx - q / 2.0)


def parse_log(path):
    steps, decisions = [], []
    with open(path, errors="replace") as fh:
        for raw in fh:
            line = ANSI.sub("", raw)
            if " step time " in line:
                f = fields(line)
                steps.append(
                    {
                        "t": timestamp(line),
                        "measured": float(f["measured_ms"]),
                        "predicted": float(f["predicted_ms"]),
                        "prefill": float(f["prefill_tokens"]),
                        "pairs": float(f["attn_pairs"]),
                        "decodes": float(f["decode_seqs"]),
                        "kv": float(f["kv_tokens"]),
                        "max_chunk": int(f["max_chunk"]),
                    }
                )
            elif " merge decision " in line:
                f = fields(line)
                decisions.append(
                    {
                        "t": timestamp(line),
                        "id": f["id"],
                        "lane": f["lane"],
                        "reason": f["reason"],
                        "wanted": int(f["wanted"]),
                        "tokens": int(f["tokens"]),
                    }
                )
    return steps, decisions


def chunk_ctx(s):
    q = s["max_chunk"]
    if q <= 1 or s["prefill"] == 0:
        return 0.0
    return s["pairs"] / q + q / 2.0


def floor_pairs(s, floor):
    """The step's attention pairs with the largest chunk's queries padded to the wave floor."""
    q = s["max_chunk"]
    if q <= 1 or s["prefill"] == 0:
        return s["pairs"]
    ctx = chunk_ctx(s)
    qf = max(q, min(floor, ctx))
    return s["pairs"] + pairs(qf, ctx) - pairs(q, ctx)


def design(steps, floor):
    """Rows of brook's cost-model features; with a floor, its sixth (`prefill_floor_pairs`)."""
    rows = []
    for s in steps:
        row = [1.0, s["prefill"], s["decodes"], s["kv"], s["pairs"]]
        if floor is not None:
            row.append(floor_pairs(s, floor) - s["pairs"])
        rows.append(row)
    return np.array(rows)


def nnls_fit(x, y):
    """Non-negative least squares by active set (as cost_model.rs), columns scaled."""
    scale = np.sqrt((x * x).sum(axis=0)) + 1e-30
    xs = x / scale
    free = np.ones(x.shape[1], bool)
    for _ in range(x.shape[1]):
        c = np.zeros(x.shape[1])
        c[free] = np.linalg.lstsq(xs[:, free], y, rcond=None)[0]
        neg = free & (c < 0)
        if not neg.any():
            break
        free[np.argmax(neg)] = False
    c[~free] = 0.0
    return c / scale


def bin_of(v, edges):
    for i, e in enumerate(edges):
        if v < e:
            return i
    return len(edges)


def label(edges, i, unit=""):
    lo = 0 if i == 0 else edges[i - 1]
    hi = edges[i] if i < len(edges) else None
    fmt = lambda v: f"{v // 1000}k" if v >= 1000 and v % 1000 == 0 else str(v)
    return f"{fmt(lo)}-{fmt(hi)}{unit}" if hi is not None else f">={fmt(lo)}{unit}"


def load_runs(src):
    if os.path.isfile(src):
        tmp = tempfile.mkdtemp(prefix="step_times.")
        with tarfile.open(src) as tf:
            tf.extractall(tmp)
        src = tmp
    logs = []
    for root, _, files in os.walk(src):
        logs += [os.path.join(root, f) for f in files if f.endswith(".serve.log")]
    return sorted(logs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", help="runs.tgz or the folder it unpacks to")
    ap.add_argument("--floor", type=int, default=512, help="wave floor Q, queries (default 512)")
    ap.add_argument("--json", help="write the fitted coefficients and tables here")
    ap.add_argument("--warmup-ms", type=float, default=150.0,
                    help="drop steps slower than this with no prefill over 64 tokens (first-call warm-up)")
    a = ap.parse_args()

    logs = load_runs(a.runs)
    if not logs:
        sys.exit(f"no *.serve.log under {a.runs}")
    all_steps, per_run = [], {}
    for path in logs:
        run = os.path.basename(path)[: -len(".serve.log")]
        steps, decisions = parse_log(path)
        per_run[run] = (steps, decisions)
        for s in steps:
            if s["measured"] > a.warmup_ms and s["prefill"] <= 64:
                continue
            s["run"] = run
            all_steps.append(s)
    y = np.array([s["measured"] for s in all_steps])
    out = {"logs": len(logs), "steps": len(all_steps), "floor": a.floor}

    # 1. The two fits over every step of every run.
    fits = {}
    for name, floor in (("linear", None), ("floor", a.floor)):
        x = design(all_steps, floor)
        c = nnls_fit(x, y)
        pred = x @ c
        fits[name] = (c, pred)
        rel = (pred - y) / y
        out[name] = {
            "coef": dict(zip(["base_ms", "per_prefill_token_ms", "per_decode_seq_ms",
                              "per_kv_token_ms", "per_prefill_attn_pair_ms",
                              "per_prefill_floor_pair_ms"], c.tolist())),
            "rmse_ms": float(np.sqrt(np.mean((pred - y) ** 2))),
            "mean_abs_rel": float(np.mean(np.abs(rel))),
        }
    logged = np.array([s["predicted"] for s in all_steps])
    out["logged"] = {
        "rmse_ms": float(np.sqrt(np.mean((logged - y) ** 2))),
        "mean_abs_rel": float(np.mean(np.abs((logged - y) / y))),
    }
    print(f"{len(logs)} runs, {len(all_steps)} steps (wave floor Q = {a.floor})")
    print(f"{'model':<28} {'RMSE ms':>8} {'mean |err|':>10}  coefficients")
    print(f"{'online fit (logged)':<28} {out['logged']['rmse_ms']:8.2f} "
          f"{100 * out['logged']['mean_abs_rel']:9.1f}%")
    for name in ("linear", "floor"):
        o = out[name]
        co = " ".join(f"{v:.3g}" for v in o["coef"].values())
        print(f"{name + ' fit':<28} {o['rmse_ms']:8.2f} {100 * o['mean_abs_rel']:9.1f}%  {co}")

    # Binned: prefill steps by largest chunk and its context; decode-only steps by rows.
    q_edges, c_edges = [64, 128, 256, 512, 1024], [2048, 4096, 8192, 12288]
    d_edges = [2, 4, 8, 16, 32]
    bins = defaultdict(list)
    for i, s in enumerate(all_steps):
        if s["max_chunk"] > 1 and s["prefill"] > 0:
            key = ("prefill", bin_of(s["max_chunk"], q_edges), bin_of(chunk_ctx(s), c_edges))
        else:
            key = ("decode", bin_of(s["decodes"], d_edges), 0)
        bins[key].append(i)
    lin, flo = fits["linear"][1], fits["floor"][1]
    table = []
    print()
    print(f"{'shape':<10} {'chunk q':>9} {'context':>10} {'steps':>6} {'dec rows':>8} "
          f"{'measured':>9} {'online':>7} {'linear':>7} {'floor':>7}   (mean ms)")
    for key in sorted(bins):
        idx = bins[key]
        kind, b1, b2 = key
        row = {
            "kind": kind,
            "chunk": label(q_edges, b1) if kind == "prefill" else "-",
            "context": label(c_edges, b2) if kind == "prefill" else "-",
            "rows": label(d_edges, b1) if kind == "decode" else
            f"{np.mean([all_steps[i]['decodes'] for i in idx]):.1f}",
            "steps": len(idx),
            "measured": float(np.mean(y[idx])),
            "online": float(np.mean(logged[idx])),
            "linear": float(np.mean(lin[idx])),
            "floor": float(np.mean(flo[idx])),
        }
        table.append(row)
        print(f"{kind:<10} {row['chunk']:>9} {row['context']:>10} {row['steps']:>6} "
              f"{row['rows']:>8} {row['measured']:9.1f} {row['online']:7.1f} "
              f"{row['linear']:7.1f} {row['floor']:7.1f}")
    out["bins"] = table

    # 2. and 3. per run: the merge decisions, and what the long documents waited on.
    print()
    print(f"{'run':<22} {'steps':>6} {'long trim':>9} {'long itl':>8} {'norm trim':>9} "
          f"{'norm itl':>8} {'long docs':>9} {'wait p50 s':>10} {'wait max s':>10} "
          f"{'held itl':>8} {'held budget':>11} {'busy':>5} {'chunk s/s':>9} {'steps/s':>7}")
    runs_out = {}
    for run, (steps, decisions) in per_run.items():
        counts = defaultdict(int)
        first_seen, first_done, held = {}, {}, defaultdict(lambda: defaultdict(int))
        computed = defaultdict(int)
        for d in decisions:
            counts[(d["lane"], d["reason"])] += 1
            if d["lane"] != "long_stream":
                continue
            rid = d["id"]
            first_seen.setdefault(rid, d["t"])
            held[rid][d["reason"]] += 1
            computed[rid] += d["tokens"]
        # A long request's prefill is done at its last granted chunk: wait = that - first seen.
        for d in decisions:
            if d["lane"] == "long_stream" and d["tokens"] > 0:
                first_done[d["id"]] = d["t"]
        waits = [first_done[r] - first_seen[r] for r in first_done]
        itl_held = sum(h.get("decode_itl", 0) for h in held.values())
        budget_held = sum(h.get("long_budget", 0) for h in held.values())
        # Busy fraction, and seconds a second in steps with a document chunk (>= 128 queries):
        # what the floor costs when chunks are trimmed small at long context.
        kept = [x for x in steps if not (x["measured"] > a.warmup_ms and x["prefill"] <= 64)]
        span = (kept[-1]["t"] - kept[0]["t"]) if len(kept) > 1 else float("nan")
        busy = sum(x["measured"] for x in kept) / 1e3 / span
        chunk = sum(x["measured"] for x in kept if x["max_chunk"] >= 128) / 1e3 / span
        r = {
            "busy": busy,
            "chunk_s_per_s": chunk,
            "steps_per_s": len(kept) / span,
            "steps": len(steps),
            "decisions": {f"{l}/{k}": v for (l, k), v in sorted(counts.items())},
            "long_docs": len(first_seen),
            "long_prefill_s_p50": float(np.median(waits)) if waits else None,
            "long_prefill_s_max": float(max(waits)) if waits else None,
            "long_held_decode_itl": itl_held,
            "long_held_budget": budget_held,
        }
        runs_out[run] = r
        p50 = f"{r['long_prefill_s_p50']:.2f}" if waits else "-"
        mx = f"{r['long_prefill_s_max']:.2f}" if waits else "-"
        print(f"{run:<22} {len(steps):>6} {counts[('long_stream', 'trimmed')]:>9} "
              f"{counts[('long_stream', 'decode_itl')]:>8} {counts[('normal', 'trimmed')]:>9} "
              f"{counts[('normal', 'decode_itl')]:>8} {len(first_seen):>9} {p50:>10} {mx:>10} "
              f"{itl_held:>8} {budget_held:>11} {busy:5.2f} {chunk:9.2f} {len(kept) / span:7.1f}")
    out["runs"] = runs_out
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

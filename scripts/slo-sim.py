#!/usr/bin/env python3
"""Issue 19's verdict in the simulator, before GPU time is spent (`brook simulate`).

Runs a workload (default configs/workloads/gpu_longtail.toml, calibrated from the H200's
measured steps) for several seeds at each rate, as k6 drives the GPU run: constant arrivals,
20 s, both policies. Prints per rate the mean (min) over seeds of what issue 19 judges: overall
attainment, the long documents', short P99 TTFT and end to end, and output throughput against
FCFS; then the verdict lines per seed at the first rate, as `scripts/slo-gpu.sh` prints them.

Usage: scripts/slo-sim.py [--workload W] [--rates 6,8] [--seeds 6] [--duration 20]
                          [--brook target/release/brook] [--poisson]
Targets: FCFS <= 88 %, adaptive >= 98 %, short P99 TTFT <= 400 ms, short P99 e2e < 800 ms,
adaptive output tokens/s >= FCFS's - 5 %.
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile


def run(brook, workload, rate, seed, duration, poisson):
    """Both policies on one trace: the workload's own Poisson arrivals, or k6's constant ones."""
    tmp = []
    if not poisson:
        workload = constant_trace(workload, rate, seed, duration, tmp)
    try:
        out = subprocess.run(
            [brook, "simulate", "-w", workload, "--rate", str(rate), "--seed", str(seed),
             "--duration", str(duration), "--json"],
            check=True, capture_output=True, text=True).stdout
    finally:
        for path in tmp:
            os.unlink(path)
    return {r["policy"]: r for r in json.loads(out)}


def constant_trace(workload, rate, seed, duration, tmp):
    """A copy of the workload replaying a trace as k6 sends it: one request every 1/rate s, each
    drawn from the workload's [[mix]] (uniform or constant lengths)."""
    text = open(workload).read()
    mix = []
    for block in re.findall(r"(?ms)^\[\[mix\]\]\n(.*?)(?=^\[|\Z)", text):
        val = lambda key: re.search(rf"(?m)^{key} = (.*)$", block).group(1)
        dist = lambda spec: [int(v) for v in re.findall(r"(?:min|max|value) = (\d+)", spec)]
        mix.append((float(val("weight")), dist(val("prompt")), dist(val("output")),
                    int(val("max_tokens"))))
    rng = random.Random(seed)
    fd, csv = tempfile.mkstemp(suffix=".csv", prefix="slo-sim.")
    tmp.append(csv)
    with os.fdopen(fd, "w") as fh:
        fh.write("arrival_s,prompt_tokens,output_tokens,max_tokens\n")
        for i in range(int(rate * duration)):
            w, prompt, output, max_tokens = rng.choices(mix, weights=[m[0] for m in mix])[0]
            p = rng.randint(prompt[0], prompt[-1])
            o = rng.randint(output[0], output[-1])
            fh.write(f"{i / rate:.6f},{p},{o},{max_tokens}\n")
    text, n = re.subn(r'(?m)^\[arrival\]\nkind = "poisson"',
                      f'[arrival]\nkind = "trace"\npath = "{csv}"', text)
    if n != 1:
        sys.exit(f"{workload}: no [arrival] kind = \"poisson\" table to replace")
    fd, path = tempfile.mkstemp(suffix=".toml", prefix="slo-sim.")
    tmp.append(path)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def verdict(runs):
    f, a = runs["fcfs"], runs["adaptive"]
    s = a["classes"]["short"]
    thr = a["output_tokens_per_s"] / f["output_tokens_per_s"] - 1
    checks = [
        ("fcfs <= 88%", f["overall"]["attainment"] <= 0.88),
        ("adaptive >= 98%", a["overall"]["attainment"] >= 0.98),
        ("short P99 TTFT <= 400 ms", s["ttft_ms"]["p99"] <= 400),
        ("short P99 e2e < 800 ms", s["e2e_ms"]["p99"] < 800),
        ("throughput >= fcfs - 5%", thr >= -0.05),
    ]
    return thr, checks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", default="configs/workloads/gpu_longtail.toml")
    ap.add_argument("--rates", default="8,6")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--brook", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"),
                                                    "release", "brook"))
    ap.add_argument("--poisson", action="store_true", help="keep the workload's Poisson arrivals")
    a = ap.parse_args()
    print(f"{'rate':>4} {'FCFS':>14} {'adaptive':>14} {'adapt long':>10} {'sTTFT p99':>9} "
          f"{'s e2e p99':>9} {'out tok/s vs FCFS':>17}   mean (min) over {a.seeds} seeds")
    for i, rate in enumerate(float(r) for r in a.rates.split(",")):
        rows = [run(a.brook, a.workload, rate, seed, a.duration, a.poisson)
                for seed in range(1, a.seeds + 1)]
        col = lambda f: [f(r) for r in rows]
        fc = col(lambda r: r["fcfs"]["overall"]["attainment"] * 100)
        ad = col(lambda r: r["adaptive"]["overall"]["attainment"] * 100)
        lg = col(lambda r: r["adaptive"]["classes"]["long"]["attainment"] * 100)
        tt = col(lambda r: r["adaptive"]["classes"]["short"]["ttft_ms"]["p99"])
        e2 = col(lambda r: r["adaptive"]["classes"]["short"]["e2e_ms"]["p99"])
        th = col(lambda r: verdict(r)[0] * 100)
        mm = lambda v: f"{sum(v) / len(v):5.1f} ({min(v):5.1f})"
        print(f"{rate:4g} {mm(fc):>14} {mm(ad):>14} {sum(lg) / len(lg):9.1f}% {max(tt):7.0f}ms "
              f"{max(e2):7.0f}ms {sum(th) / len(th):+8.1f} % ({min(th):+.1f})")
        if i == 0:
            verdicts = [verdict(r) for r in rows]
    for seed, (thr, checks) in enumerate(verdicts, 1):
        ok = sum(c for _, c in checks) == len(checks)
        print(f"seed {seed}: " + ", ".join(f"{n}: {'yes' if c else 'NO'}" for n, c in checks)
              + f" (throughput {thr * 100:+.1f} %)" + (" -> all met" if ok else ""))
    met = sum(all(c for _, c in v[1]) for v in verdicts)
    print(f"seeds meeting every target at the first rate: {met} of {len(verdicts)}")


if __name__ == "__main__":
    main()

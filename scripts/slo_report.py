#!/usr/bin/env python3
"""Summaries of loadtest/longtail_ws.js runs (scripts/slo-gpu.sh, scripts/longtail-compare.sh).

  slo_report.py attainment RUN.k6.json   overall SLO attainment (0..1), every arrival counted
  slo_report.py line RUN.k6.json         one line: attainment per class, tails, throughput, drops
  slo_report.py report OUTDIR            OUTDIR/runs/*.meta.json + *.k6.json -> OUTDIR/results.json,
                                         OUTDIR/attainment_vs_rate.png (when matplotlib loads),
                                         the table and the issue-19 verdict on stdout

Attainment counts k6's dropped arrivals (no VU free: the server fell behind) and requests still
open when k6 stopped as misses: met / (started + dropped). longtail_ws.js writes it as `slo_met`;
it is recomputed here from the counts so that summaries written before that change (which left
drops out) are not mistaken for current ones.
"""
import glob
import json
import os
import sys

CLASSES = ("short", "medium", "long")
# Issue 19's targets.
FCFS_CLIFF = 0.88
ADAPTIVE_MIN = 0.98
SHORT_TTFT_P99_MS = 400.0
SHORT_E2E_P99_MS = 800.0
THROUGHPUT_TOLERANCE = 0.05


def load(path):
    with open(path) as f:
        return json.load(f)


def attainment(k6):
    """Share of every arrival (started or dropped) that met its SLO; None with no arrival."""
    if "started" not in k6:
        raise SystemExit(
            f"summary without start counts (an older longtail_ws.js?): {sorted(k6)}"
        )
    total = k6["started"] + k6.get("dropped", 0)
    return k6["met"] / total if total else None


def pct(x):
    return "-" if x is None else f"{100 * x:.1f} %"


def ms(trend, stat="p(99)"):
    v = (trend or {}).get(stat)
    return "-" if v is None else f"{v:.0f}"


def line(k6):
    parts = [f"SLO met {pct(attainment(k6))} of {k6['requests']}"]
    parts.append(" ".join(f"{c} {pct(k6.get('slo_met_' + c))}" for c in CLASSES if k6.get("started_" + c)))
    parts.append(f"short TTFT P50/P99 {ms(k6.get('ttft_short'), 'med')}/{ms(k6.get('ttft_short'))} ms")
    parts.append(f"short e2e P99 {ms(k6.get('e2e_short'))} ms")
    parts.append(f"long TTFT P99 {ms(k6.get('ttft_long'))} ms")
    parts.append(f"out {k6.get('tokens_per_s') or 0:.0f} tok/s")
    parts.append(f"dropped {k6.get('dropped', 0)}, interrupted {k6.get('interrupted', 0)}")
    spans = []
    for c in ("medium", "long"):
        p = k6.get("prompt_tokens_" + c) or {}
        if p.get("max"):
            spans.append(f"{c} {p['min']:.0f}-{p['max']:.0f}")
    if spans:
        parts.append("prompt tokens " + ", ".join(spans))
    return "; ".join(parts)


def runs(outdir):
    """Every run with a summary: its meta (phase, policy, rate, repeat, timings) plus figures."""
    out = []
    for meta_path in sorted(glob.glob(os.path.join(outdir, "runs", "*.meta.json"))):
        meta = load(meta_path)
        k6_path = meta_path.replace(".meta.json", ".k6.json")
        if not os.path.exists(k6_path):
            meta["error"] = meta.get("error") or "no k6 summary"
            out.append(meta)
            continue
        k6 = load(k6_path)
        meta["k6"] = k6
        meta["slo_met"] = attainment(k6)
        out.append(meta)
    return out


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def verdict(main, cliff):
    """Issue 19's criteria at the cliff rate, per repeat: lines of text and whether all held."""
    at = [r for r in main if r.get("rate") == cliff and "k6" in r]
    by_repeat = {}
    for r in at:
        by_repeat.setdefault(r["repeat"], {})[r["policy"]] = r
    lines, passed = [], 0
    for rep in sorted(by_repeat):
        pair = by_repeat[rep]
        if "fcfs" not in pair or "adaptive" not in pair:
            lines.append(f"repeat {rep}: incomplete ({sorted(pair)})")
            continue
        f, a = pair["fcfs"], pair["adaptive"]
        fk, ak = f["k6"], a["k6"]
        tput = (ak.get("tokens_per_s") or 0) / (fk.get("tokens_per_s") or float("nan"))
        checks = {
            f"fcfs <= {FCFS_CLIFF:.0%}": f["slo_met"] is not None and f["slo_met"] <= FCFS_CLIFF,
            f"adaptive >= {ADAPTIVE_MIN:.0%}": a["slo_met"] is not None and a["slo_met"] >= ADAPTIVE_MIN,
            f"short P99 TTFT <= {SHORT_TTFT_P99_MS:.0f} ms": (ak.get("ttft_short") or {}).get("p(99)", 1e18) <= SHORT_TTFT_P99_MS,
            f"short P99 e2e < {SHORT_E2E_P99_MS:.0f} ms": (ak.get("e2e_short") or {}).get("p(99)", 1e18) < SHORT_E2E_P99_MS,
            # Lower by at most the tolerance; more is no failure (FCFS past its cliff delivers less).
            f"throughput >= fcfs - {THROUGHPUT_TOLERANCE:.0%}": tput >= 1 - THROUGHPUT_TOLERANCE,
        }
        ok = all(checks.values())
        passed += ok
        detail = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items())
        lines.append(
            f"repeat {rep}: fcfs {pct(f['slo_met'])}, adaptive {pct(a['slo_met'])}, "
            f"short P99 TTFT {ms(ak.get('ttft_short'))} ms, e2e {ms(ak.get('e2e_short'))} ms, "
            f"throughput {tput - 1:+.1%} -> {detail}"
        )
    lines.append(f"repeats meeting every target at {cliff} req/s: {passed} of {len(by_repeat)}")
    return lines, passed, len(by_repeat)


def plot(outdir, scan, main, cliff):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # the device has matplotlib; a bare machine may not
        print(f"(no plot: matplotlib did not load: {e})")
        return None
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"fcfs": "tab:red", "adaptive": "tab:blue"}
    pts = sorted((r for r in scan if "k6" in r), key=lambda r: r["rate"])
    if pts:
        ax.plot([r["rate"] for r in pts], [100 * r["slo_met"] for r in pts], "o--", mfc="none",
                color=colors["fcfs"], label="fcfs (scan)")
    for policy in ("fcfs", "adaptive"):
        rs = [r for r in main if r.get("policy") == policy and "k6" in r]
        if not rs:
            continue
        ax.scatter([r["rate"] for r in rs], [100 * r["slo_met"] for r in rs], color=colors[policy],
                   alpha=0.6, label=f"{policy} (repeats)")
        rates = sorted({r["rate"] for r in rs})
        means = [100 * mean([r["slo_met"] for r in rs if r["rate"] == x]) for x in rates]
        ax.plot(rates, means, "-", color=colors[policy])
        ttft = [mean([r["k6"].get("ttft_short", {}).get("p(99)") for r in rs if r["rate"] == x]) for x in rates]
        ax2.plot(rates, ttft, "o-", color=colors[policy], label=policy)
    for y, style in ((100 * FCFS_CLIFF, ":"), (100 * ADAPTIVE_MIN, "--")):
        ax.axhline(y, color="gray", linestyle=style, linewidth=1)
    if cliff is not None:
        ax.axvline(cliff, color="gray", linewidth=0.8)
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("requests meeting TTFT and ITL SLOs (%)")
    ax.set_title("SLO attainment (dropped arrivals count as misses)")
    ax.legend()
    ax2.axhline(SHORT_TTFT_P99_MS, color="gray", linestyle="--", linewidth=1)
    ax2.set_xlabel("arrival rate (requests/s)")
    ax2.set_ylabel("short requests' P99 TTFT (ms)")
    ax2.set_yscale("log")
    ax2.set_title("short P99 TTFT (mean over repeats)")
    ax2.legend()
    exp = load(os.path.join(outdir, "experiment.json")) if os.path.exists(os.path.join(outdir, "experiment.json")) else {}
    fig.suptitle(f"brook {exp.get('commit', '')}: {exp.get('shape', '')} on {exp.get('device', '')}, "
                 f"{exp.get('run_duration_s', '?')} s runs; lines at {FCFS_CLIFF:.0%} and {ADAPTIVE_MIN:.0%}")
    fig.tight_layout()
    path = os.path.join(outdir, "attainment_vs_rate.png")
    fig.savefig(path, dpi=110)
    return path


def report(outdir):
    all_runs = runs(outdir)
    meta_path = os.path.join(outdir, "experiment.json")
    experiment = load(meta_path) if os.path.exists(meta_path) else {}
    scan = [r for r in all_runs if r.get("phase") == "scan"]
    main = [r for r in all_runs if r.get("phase") == "main"]
    cliff = experiment.get("cliff_rate")
    lines, passed, repeats = verdict(main, cliff) if cliff is not None else ([], 0, 0)
    try:
        png = plot(outdir, scan, main, cliff)
    except Exception as e:  # the table and results.json matter more than the picture
        print(f"(no plot: {e!r})")
        png = None
    results = {
        "experiment": experiment,
        "targets": {
            "fcfs_at_cliff_max": FCFS_CLIFF,
            "adaptive_min": ADAPTIVE_MIN,
            "short_ttft_p99_ms": SHORT_TTFT_P99_MS,
            "short_e2e_p99_ms": SHORT_E2E_P99_MS,
            "throughput_tolerance": THROUGHPUT_TOLERANCE,
        },
        "verdict": {"lines": lines, "repeats_passed": passed, "repeats": repeats},
        "runs": all_runs,
        "plot": os.path.basename(png) if png else None,
    }
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"== results: {os.path.join(outdir, 'results.json')}" + (f", plot: {png}" if png else ""))
    for r in all_runs:
        if "error" in r:
            print(f"  {r.get('tag')}: {r['error']}")
    print(f"{'phase':5} {'rate':>6} {'policy':8} {'rep':>3} {'met':>7} {'short':>7} {'medium':>7} {'long':>7} "
          f"{'sTTFT p99':>9} {'s e2e p99':>9} {'lTTFT p99':>9} {'tok/s':>7} {'drop':>5}")
    order = {"fcfs": 0, "adaptive": 1}
    rows = sorted(scan, key=lambda r: r["rate"]) + sorted(
        main, key=lambda r: (r["rate"], r.get("repeat", 0), order.get(r.get("policy"), 2)))
    for r in rows:
        if "k6" not in r:
            continue
        k = r["k6"]
        rep = r.get("repeat") or "-"
        print(f"{r['phase']:5} {r['rate']:>6} {r['policy']:8} {rep:>3} {pct(r['slo_met']):>7} "
              f"{pct(k.get('slo_met_short')):>7} {pct(k.get('slo_met_medium')):>7} {pct(k.get('slo_met_long')):>7} "
              f"{ms(k.get('ttft_short')):>9} {ms(k.get('e2e_short')):>9} {ms(k.get('ttft_long')):>9} "
              f"{k.get('tokens_per_s') or 0:>7.0f} {k.get('dropped', 0):>5}")
    for l in lines:
        print(l)


def main(argv):
    if len(argv) != 3 or argv[1] not in ("attainment", "line", "report"):
        print(__doc__)
        return 2
    if argv[1] == "attainment":
        a = attainment(load(argv[2]))
        print("nan" if a is None else f"{a:.6f}")
    elif argv[1] == "line":
        print(line(load(argv[2])))
    else:
        report(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

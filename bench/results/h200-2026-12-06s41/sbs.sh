#!/usr/bin/env bash
# Session 41, call 4: brook beside llama.cpp on one machine (warm after call 3), the kit's
# side_by_side.sh with the llama.cpp build. brook = 385f954 (the deep ring by default), packed as
#   cargo build --release --bin gpu-bench --bin brook; objcopy --strip-all into .carry/cuda;
#   xz into .carry/cudaxz (the tree and the carry must stay under 64 MiB)
# carry [".carry/llamacpp", ".carry/cudaxz"] (.carry/llamacpp from bench/peers/llamacpp/prepare_source.sh).
mkdir -p .carry/cuda && for b in brook gpu-bench; do xz -dc .carry/cudaxz/$b.xz > .carry/cuda/$b && chmod +x .carry/cuda/$b; done
cp .carry/cudaxz/COMMIT .carry/cuda/
bash bench/peers/side_by_side.sh --build-llama --budget 540
cd $OUT && tar czf /tmp/sbs.tgz . 2>/dev/null; mv /tmp/sbs.tgz $OUT/

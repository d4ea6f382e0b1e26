#!/usr/bin/env bash
# Session 24, call 1: gpu-bench overlap (two nano-batches on two streams vs one stream), then the
# bulk gemv's switches (bulk18: kernel tests, CUDA-vs-CPU, decode batch 1 per config, twice, and
# the session 21 build 665908a as BEFORE).
# Carry: .carry/pack24 (tar cJf of .carry/cuda and .carry/before665: the tree limit is 64 MiB)
tar xJf .carry/pack24/p.txz -C .carry || exit 1
cd .carry/cuda || exit 1
./gpu-check.sh device overlap18
BEFORE=$PWD/../before665 ./gpu-check.sh device bulk18

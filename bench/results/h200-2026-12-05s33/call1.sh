#!/usr/bin/env bash
# NOT RUN: no machine could be started while it was current; folded into call3.sh, which ran.
# Session 33's first GPU call: session 32's call1.sh as written (its binaries packed by
# ../h200-2026-12-05s32/pack.sh into .carry/gb32; brook rebuilt at session 33's first commit,
# whose bench also prints the executor's time a step). Carry [".carry/gb32"].
bash bench/results/h200-2026-12-05s32/call1.sh
grep "==\|executor" /tmp/o1/itl.log

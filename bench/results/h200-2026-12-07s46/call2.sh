#!/usr/bin/env bash
# Session 46, call 2 and later: call1.sh (same packs, same carry [".carry/gb44a", ".carry/gb45"])
# with H200_ONLY=1. On an H200 it runs call1.sh whole, then the deep-against-tight ring timing.
# On any other card it runs only that timing and stops: three H100 calls (sessions 45-46) have
# measured the A/B there already, and only the H200 figure is missing.
H200_ONLY=1 exec bash "$(dirname "$0")/call1.sh"

#!/usr/bin/env bash
# Session 46, call 2 and later: call1.sh (same packs, same carry [".carry/gb44a", ".carry/gb45"]),
# stopping after nvidia-smi unless the card is an H200: three H100 calls (sessions 45-46) have
# measured these builds there already, and only the H200 figure is missing.
H200_ONLY=1 exec bash "$(dirname "$0")/call1.sh"

#!/usr/bin/env bash
# The official `openai` Python client (pinned in tests/openai/requirements.txt, installed here
# with pip) against `brook serve` on the bundled demo model, CPU: tests/openai/test_openai_api.py
# starts the servers itself. Build target/release/brook first.
# Usage: scripts/openai-test.sh   (env: BROOK_BIN, BROOK_MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/brook-bin.sh
python3 -m pip install --quiet --disable-pip-version-check -r tests/openai/requirements.txt
python3 -c 'import openai; print("openai", openai.__version__)'
python3 tests/openai/test_openai_api.py

#!/usr/bin/env bash
# Browser test of the page (static/: chat and dashboard) in Debian's Chromium, driven by
# playwright-core (pinned in tests/browser/package-lock.json; it downloads no browser). Installs
# Chromium with apt-get when missing, runs tests/browser/page.test.mjs, which starts
# target/release/brook itself (build it first), and saves screenshots of both pages (light and
# dark, desktop and phone) to target-out/browser/.
# Usage: scripts/browser-test.sh   (env: BROOK_BIN, CHROMIUM, BROWSER_OUT)
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/brook-bin.sh

if ! command -v chromium >/dev/null 2>&1; then
  echo "== installing chromium (Debian package)"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
export CHROMIUM=${CHROMIUM:-$(command -v chromium)}
"$CHROMIUM" --version 2>/dev/null || true

echo "== npm ci (tests/browser)"
(cd tests/browser && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)

export BROWSER_OUT=${BROWSER_OUT:-$PWD/target-out/browser}
rm -rf "$BROWSER_OUT"
mkdir -p "$BROWSER_OUT"
cd tests/browser
node --test --test-concurrency=1 --test-reporter=spec page.test.mjs
echo "screenshots: $(find "$BROWSER_OUT" -name '*.png' | wc -l) PNG files in $BROWSER_OUT"

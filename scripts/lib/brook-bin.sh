# Sourced by the test scripts, from the repository root: exports BROOK_BIN (default: the release
# build under CARGO_TARGET_DIR, or target/), as an absolute path, and stops when it is not built.
TARGET_DIR=${CARGO_TARGET_DIR:-target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR=$PWD/$TARGET_DIR ;; esac
export BROOK_BIN=${BROOK_BIN:-$TARGET_DIR/release/brook}
[ -x "$BROOK_BIN" ] || { echo "no $BROOK_BIN: run cargo build --release first"; exit 1; }

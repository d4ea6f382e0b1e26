//! Pins `brook simulate --json` for every shipped workload in configs/workloads/: refactors of
//! the scheduler core, the step contract or the simulator must leave every figure byte-identical.
//!
//! Fixtures (tests/fixtures/simulate/): the full JSON of each workload at its default rate (both
//! policies), and for a workload with a `sweep` list, the FNV-1a digest and length of the whole
//! `--sweep --json` output (47 KB of JSON would be noise in the repo; a failing digest names the
//! command that reproduces it). A deliberate change of scheduling behaviour regenerates them with
//! `BROOK_BLESS=1 cargo test --release --test simulate_pin` and says why in its commit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn simulate(workload: &Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_brook"))
        .arg("simulate")
        .arg("--workload")
        .arg(workload)
        .arg("--json")
        .args(extra)
        .output()
        .expect("running brook simulate");
    assert!(
        out.status.success(),
        "brook simulate {} failed: {}",
        workload.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("JSON is UTF-8")
}

/// FNV-1a, 64 bits: stable across platforms and Rust versions (std's hashers are not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn digest(text: &str) -> String {
    format!(
        "fnv1a64 {:016x} bytes {}\n",
        fnv1a(text.as_bytes()),
        text.len()
    )
}

fn bless() -> bool {
    std::env::var_os("BROOK_BLESS").is_some_and(|v| v == "1")
}

/// Compares `got` with the fixture `name`, or rewrites the fixture under BROOK_BLESS=1.
fn check(name: &str, got: &str, reproduce: &str) {
    let path = root().join("tests/fixtures/simulate").join(name);
    if bless() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (BROOK_BLESS=1 writes it)", path.display()));
    if got == want {
        return;
    }
    let first = got
        .lines()
        .zip(want.lines())
        .position(|(g, w)| g != w)
        .unwrap_or(got.lines().count().min(want.lines().count()));
    panic!(
        "{name} changed (first difference at line {}: got {:?}, pinned {:?}); reproduce with `{reproduce}`",
        first + 1,
        got.lines().nth(first),
        want.lines().nth(first)
    );
}

/// The shipped workloads, by file stem.
fn workloads() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("configs/workloads"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    assert!(v.len() >= 2, "no workloads found: {v:?}");
    v
}

#[test]
fn simulator_json_is_pinned_for_every_shipped_workload() {
    for w in workloads() {
        let stem = w.file_stem().unwrap().to_string_lossy().into_owned();
        let json = simulate(&w, &[]);
        let cmd = format!("brook simulate --workload {} --json", w.display());
        check(&format!("{stem}.json"), &json, &cmd);
        let text = std::fs::read_to_string(&w).unwrap();
        if text.lines().any(|l| l.trim_start().starts_with("sweep")) {
            let sweep = simulate(&w, &["--sweep"]);
            check(
                &format!("{stem}.sweep.digest"),
                &digest(&sweep),
                &format!("{cmd} --sweep"),
            );
        }
    }
}

#[test]
fn digest_is_fnv1a() {
    // Reference values of FNV-1a 64.
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
}

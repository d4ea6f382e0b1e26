//! scripts/slo_report.py, which scripts/slo-gpu.sh and scripts/longtail-compare.sh read k6's
//! long-tail summaries with: dropped and unfinished arrivals count as misses, and the issue-19
//! verdict is judged per repeat at the cliff rate. Needs python3 (CI has it for k6).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/slo_report.py")
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("python3 runs scripts/slo_report.py");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A k6 summary as loadtest/longtail_ws.js writes it (the fields the report reads).
fn summary(started: u64, dropped: u64, met: u64, ttft_p99: f64, e2e_p99: f64, tok_s: f64) -> Value {
    json!({
        "requests": started + dropped, "started": started, "dropped": dropped, "interrupted": 0,
        "met": met, "tokens_per_s": tok_s,
        "started_short": started, "slo_met_short": met as f64 / started as f64,
        "ttft_short": {"med": 50.0, "p(99)": ttft_p99}, "e2e_short": {"p(99)": e2e_p99},
        "ttft_long": {"p(99)": 3000.0},
    })
}

fn write(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_string(v).unwrap()).unwrap();
}

#[test]
fn dropped_arrivals_count_as_misses() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k6.json");
    // 85 of 90 started met their SLOs, and k6 dropped 10 more: 85 of 100.
    write(&p, &summary(90, 10, 85, 100.0, 500.0, 1000.0));
    let (ok, out) = run(&["attainment", p.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "0.850000");
    let (ok, out) = run(&["line", p.to_str().unwrap()]);
    assert!(
        ok && out.contains("SLO met 85.0 % of 100") && out.contains("dropped 10"),
        "{out}"
    );
    // A summary of the old script (no start count, drops left out) is refused, not misread.
    write(&p, &json!({"slo_met": 0.97, "requests": 90}));
    let (ok, out) = run(&["attainment", p.to_str().unwrap()]);
    assert!(!ok && out.contains("start counts"), "{out}");
}

#[test]
fn the_verdict_is_judged_per_repeat_at_the_cliff() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    let put = |tag: &str, phase: &str, policy: &str, rate: f64, repeat: u64, k6: Value| {
        write(
            &runs.join(format!("{tag}.meta.json")),
            &json!({"tag": tag, "phase": phase, "policy": policy, "rate": rate, "repeat": repeat}),
        );
        write(&runs.join(format!("{tag}.k6.json")), &k6);
    };
    put(
        "scan-10",
        "scan",
        "fcfs",
        10.0,
        0,
        summary(100, 0, 95, 300.0, 700.0, 900.0),
    );
    put(
        "scan-20",
        "scan",
        "fcfs",
        20.0,
        0,
        summary(190, 10, 160, 900.0, 2000.0, 1500.0),
    );
    // Repeat 1 meets every target; repeat 2 delivers 7 % fewer tokens than FCFS; repeat 3's
    // short P99 TTFT is 450 ms; repeat 4 delivers 20 % more (no failure).
    let repeats = [
        (1, 300.0, 1530.0),
        (2, 350.0, 1395.0),
        (3, 450.0, 1500.0),
        (4, 300.0, 1800.0),
    ];
    for (rep, ttft, tok_s) in repeats {
        let tag = format!("main-20-r{rep}");
        put(
            &format!("{tag}-fcfs"),
            "main",
            "fcfs",
            20.0,
            rep,
            summary(195, 5, 170, 900.0, 2000.0, 1500.0),
        );
        put(
            &format!("{tag}-adaptive"),
            "main",
            "adaptive",
            20.0,
            rep,
            summary(200, 0, 198, ttft, 700.0, tok_s),
        );
    }
    // The rate below: not judged.
    put(
        "main-15-r1-adaptive",
        "main",
        "adaptive",
        15.0,
        1,
        summary(150, 0, 100, 5000.0, 9000.0, 10.0),
    );
    write(
        &dir.path().join("experiment.json"),
        &json!({"cliff_rate": 20.0, "commit": "test"}),
    );
    let (ok, out) = run(&["report", dir.path().to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(
        out.contains("repeats meeting every target at 20.0 req/s: 2 of 4"),
        "{out}"
    );
    assert!(out.contains("short P99 TTFT <= 400 ms: NO"), "{out}");
    assert!(out.contains("throughput -7.0% -> "), "{out}");
    assert!(out.contains("throughput >= fcfs - 5%: NO"), "{out}");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .unwrap();
    assert_eq!(results["verdict"]["repeats_passed"], 2);
    assert_eq!(results["verdict"]["repeats"], 4);
    let runs = results["runs"].as_array().unwrap();
    let scan20 = runs.iter().find(|r| r["tag"] == "scan-20").unwrap();
    assert_eq!(scan20["slo_met"], 0.8, "160 of 190 started + 10 dropped");
}

//! Simulator tests: workload parsing, determinism, and the attainment accounting.

use super::report::report;
use super::sim::{run_once, RequestRecord, SimRun};
use super::workload::{parse_trace, Workload};
use super::*;
use crate::scheduler::{CostCoefficients, RequestClass, SchedulerStats, SloConfig};

/// A small mixed workload: 30 s of arrivals, short questions and a few long documents.
fn workload() -> Workload {
    let w: Workload = toml::from_str(
        r#"
        name = "test"
        seed = 3
        duration_s = 30
        rate = 8
        [arrival]
        kind = "poisson"
        [[mix]]
        name = "q"
        weight = 0.9
        prompt = { dist = "lognormal", median = 40, sigma = 0.6, min = 4, max = 600 }
        output = { dist = "lognormal", median = 60, sigma = 0.5, min = 2, max = 300 }
        [[mix]]
        name = "doc"
        weight = 0.1
        prompt = { dist = "uniform", min = 2000, max = 12000 }
        output = { dist = "constant", value = 100 }
        [scheduler]
        max_model_len = 16384
        long_prefill_token_threshold = 512
        "#,
    )
    .unwrap();
    w.validate().unwrap();
    w
}

#[test]
fn same_seed_same_figures_other_seed_other_figures() {
    let w = workload();
    for policy in [Policy::Fcfs, Policy::Adaptive] {
        let a = simulate(&w, policy, 8.0, None).unwrap();
        let b = simulate(&w, policy, 8.0, None).unwrap();
        assert_eq!(a, b, "{policy:?} is not deterministic");
        assert!(a.overall.requests > 150);
        let c = simulate(
            &Workload {
                seed: 4,
                ..w.clone()
            },
            policy,
            8.0,
            None,
        )
        .unwrap();
        assert_ne!(a.overall.requests, c.overall.requests);
    }
}

#[test]
fn every_request_runs_to_its_drawn_length() {
    let w = workload();
    let reqs = w.requests(8.0).unwrap();
    let run = run_once(&w, Policy::Adaptive, 8.0, None).unwrap();
    assert_eq!(run.records.len(), reqs.len());
    for (r, rec) in reqs.iter().zip(&run.records) {
        if rec.rejected {
            continue;
        }
        assert_eq!(rec.output_tokens, r.output_tokens);
        assert_eq!(rec.itl_s.len(), r.output_tokens - 1);
        assert!(rec.ttft_s().unwrap() > 0.0);
        assert!(rec.finished_s.unwrap() >= rec.last_token_s.unwrap());
    }
    // The scheduler learnt the executor's step time.
    let (fit, truth) = (run.fitted_cost, w.engine.cost);
    assert!(
        (fit.per_prefill_token_ms - truth.per_prefill_token_ms).abs()
            < 0.1 * truth.per_prefill_token_ms
    );
}

fn record(class: RequestClass, ttft_ms: f64, itl_ms: &[f64]) -> RequestRecord {
    let arrival_s = 1.0;
    let first = arrival_s + ttft_ms / 1e3;
    let mut last = first;
    let mut itl_s = Vec::new();
    for gap in itl_ms {
        last += gap / 1e3;
        itl_s.push(gap / 1e3);
    }
    RequestRecord {
        class: Some(class),
        prompt_tokens: 10,
        arrival_s,
        rejected: false,
        first_token_s: Some(first),
        last_token_s: Some(last),
        output_tokens: itl_ms.len() + 1,
        finished_s: Some(last),
        itl_s,
    }
}

#[test]
fn attainment_needs_both_slos_and_counts_rejections_as_missed() {
    let slo = SloConfig::default(); // short: 300 ms TTFT, 50 ms ITL
    let short = RequestClass::Short;
    let records = vec![
        record(short, 120.0, &[30.0, 45.0, 40.0]),  // meets both
        record(short, 120.0, &[]),                  // one token: no ITL to miss
        record(short, 350.0, &[10.0]),              // TTFT missed
        record(short, 100.0, &[20.0, 90.0, 60.0]),  // mean ITL 56.7 ms missed
        record(short, 100.0, &[20.0, 110.0, 10.0]), // mean ITL 46.7 ms: met despite a spike
        RequestRecord {
            rejected: true,
            first_token_s: None,
            last_token_s: None,
            finished_s: None,
            output_tokens: 0,
            itl_s: Vec::new(),
            ..record(short, 0.0, &[])
        },
        RequestRecord {
            finished_s: None,
            ..record(RequestClass::Long, 100.0, &[10.0]) // unfinished
        },
    ];
    let run = SimRun {
        policy: Policy::Adaptive,
        rate: 1.0,
        records,
        makespan_s: 10.0,
        steps: 1,
        stats: SchedulerStats::default(),
        fitted_cost: CostCoefficients::default(),
        lookahead: None,
    };
    let r = report("t", 5.0, &slo, &run);
    assert_eq!((r.overall.requests, r.overall.attained), (7, 3));
    assert_eq!((r.overall.rejected, r.overall.unfinished), (1, 1));
    assert_eq!((r.overall.missed_ttft, r.overall.missed_itl), (1, 1));
    assert_eq!(r.classes["short"].attained, 3);
    assert_eq!(r.classes["short"].requests, 6);
    assert_eq!(r.classes["long"].attainment, 0.0);
    assert_eq!(r.classes["medium"].requests, 0);
    assert_eq!(r.goodput_rps, 3.0 / 5.0);
    // 4 + 1 + 2 + 4 + 4 + 0 + 2 output tokens over 10 s.
    assert_eq!(r.output_tokens_per_s, 1.7);
    let ttft = r.classes["short"].ttft_ms.unwrap();
    assert!((ttft.p50 - 120.0).abs() < 1e-6 && (ttft.p99 - 350.0).abs() < 1e-6);
}

#[test]
fn shipped_workloads_parse_and_match_their_description() {
    let w = Workload::from_file(std::path::Path::new(
        "configs/workloads/ecommerce_peak.toml",
    ))
    .unwrap();
    let reqs = w.requests(w.rate).unwrap();
    let n = reqs.len() as f64;
    assert!(
        (n / w.duration_s - w.rate).abs() < 0.1 * w.rate,
        "{n} arrivals"
    );
    let docs = reqs.iter().filter(|r| r.prompt_tokens >= 2000).count() as f64;
    assert!((docs / n - 0.1).abs() < 0.02, "document share {}", docs / n);
    assert!(reqs
        .iter()
        .all(|r| r.prompt_tokens <= 16_000 && r.output_tokens <= r.max_tokens));
    let mut short: Vec<usize> = reqs
        .iter()
        .filter(|r| r.prompt_tokens < 2000)
        .map(|r| r.prompt_tokens)
        .collect();
    short.sort_unstable();
    let median = short[short.len() / 2] as f64;
    assert!((median - 45.0).abs() < 5.0, "question median {median}");
    let t =
        Workload::from_file(std::path::Path::new("configs/workloads/trace_example.toml")).unwrap();
    assert!(!t.requests(t.rate).unwrap().is_empty());
}

#[test]
fn traces_parse_and_rescale_to_the_rate() {
    let trace = "arrival_s,prompt_tokens,output_tokens,max_tokens\n\
                 0.5,30,10\n\
                 # a comment\n\
                 0.0,9000,200,512\n\
                 2.0,50,700,600\n";
    let reqs = parse_trace(trace).unwrap();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[0].prompt_tokens, 9000);
    assert_eq!((reqs[2].output_tokens, reqs[2].max_tokens), (600, 600));
    assert!(parse_trace("h\n1.0,x,3\n").is_err());
    assert!(parse_trace("h\n").is_err());

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.csv"), trace).unwrap();
    let w =
        "name = \"t\"\nduration_s = 10\nrate = 1\n[arrival]\nkind = \"trace\"\npath = \"t.csv\"\n";
    std::fs::write(dir.path().join("w.toml"), w).unwrap();
    let w = Workload::from_file(&dir.path().join("w.toml")).unwrap();
    // 3 requests over 2 s is 1.5 req/s; at 3 req/s the trace takes 1 s.
    let fast = w.requests(3.0).unwrap();
    assert!((fast[2].arrival_s - 1.0).abs() < 1e-9);
}

/// Distributions, durations and rates that cannot be what was meant are refused, by name.
#[test]
fn bad_workload_values_are_refused() {
    use super::workload::LengthDist;
    let bad = [
        (LengthDist::Constant { value: 0 }, "constant of 0"),
        (LengthDist::Uniform { min: 9, max: 3 }, "min 9 > max 3"),
        (
            LengthDist::Lognormal {
                median: 0.0,
                sigma: 1.0,
                min: 1,
                max: 10,
            },
            "median must be > 0",
        ),
        (
            LengthDist::Lognormal {
                median: 5.0,
                sigma: -1.0,
                min: 1,
                max: 10,
            },
            "sigma must be >= 0",
        ),
    ];
    for (d, says) in bad {
        let e = d.validate("mix \"a\" prompt").unwrap_err().to_string();
        assert!(e.contains(says) && e.contains("mix"), "{e}");
    }
    let mut w = workload();
    w.duration_s = f64::INFINITY;
    assert!(w.validate().is_err());
    let w = workload();
    for rate in [f64::INFINITY, 0.0, f64::NAN] {
        assert!(super::simulate(&w, crate::scheduler::Policy::Fcfs, rate, None).is_err());
    }
    let mut w = workload();
    w.duration_s = 1e12;
    let e = super::simulate(&w, crate::scheduler::Policy::Fcfs, 10.0, None).unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
    assert!(parse_trace("h\n-1,5,5\n")
        .unwrap_err()
        .to_string()
        .contains("arrival_s must be >= 0"));
}

#[test]
fn sweep_ranges_parse() {
    let w = workload();
    assert_eq!(
        sweep_rates("2:4:0.5", &w).unwrap(),
        vec![2.0, 2.5, 3.0, 3.5, 4.0]
    );
    assert!(sweep_rates("4:2:1", &w).is_err());
    assert!(sweep_rates("1:2", &w).is_err());
    assert!(
        sweep_rates("", &w).is_err(),
        "no sweep list in the workload"
    );
}

#[test]
fn find_rate_brackets_the_fcfs_attainment() {
    let w = workload();
    let rate = find_rate(&w, 0.9).unwrap();
    assert!(
        simulate(&w, Policy::Fcfs, rate, None)
            .unwrap()
            .overall
            .attainment
            <= 0.9
    );
    assert!(
        simulate(&w, Policy::Fcfs, rate * 0.97, None)
            .unwrap()
            .overall
            .attainment
            > 0.9
    );
}

/// One step of one sequence computing `q` tokens after `computed`, for the executor's cost.
fn one_chunk(computed: usize, q: usize) -> crate::step::SchedulerOutput {
    crate::step::SchedulerOutput {
        scheduled: vec![crate::step::ScheduledRequest {
            id: crate::request::RequestId(1),
            num_computed_tokens: computed,
            num_tokens: q,
            num_draft_tokens: 0,
            sample: false,
            truncate_blocks_to: None,
            new_block_ids: Vec::new(),
            num_freed_blocks: 0,
            new: None,
        }],
        ..Default::default()
    }
}

#[test]
fn a_chunk_below_the_attention_floor_costs_the_floors_attention() {
    // Only the attention term, no noise: step time = pairs × 1e-5 ms.
    let cost = CostCoefficients {
        base_ms: 0.0,
        per_prefill_token_ms: 0.0,
        per_decode_seq_ms: 0.0,
        per_kv_token_ms: 0.0,
        per_prefill_attn_pair_ms: 1e-5,
        per_prefill_floor_pair_ms: 0.0,
    };
    let ms = |floor: usize, computed: usize, q: usize| {
        let mut e = executor::CostModelExecutor::new(cost, 0.0, floor, 1, 16, 16, 20_000);
        e.step_time(&one_chunk(computed, q)) * 1e3
    };
    let pairs = |q: f64, ctx: f64| q * (ctx - q / 2.0) * 1e-5;
    // Off: linear in the chunk.
    assert!((ms(0, 12_000, 64) - pairs(64.0, 12_064.0)).abs() < 1e-9);
    // A 64-query chunk at 12k context costs what 256 queries cost there; 512 is above the floor.
    assert!((ms(256, 12_000, 64) - pairs(256.0, 12_064.0)).abs() < 1e-9);
    assert!((ms(256, 12_000, 512) - pairs(512.0, 12_512.0)).abs() < 1e-9);
    // Never more queries than the context holds.
    assert!((ms(256, 0, 100) - pairs(100.0, 100.0)).abs() < 1e-9);
}

#[test]
fn judge_replaces_the_criterion_and_e2e_is_reported() {
    let w = Workload {
        judge: Some(SloConfig {
            short: crate::scheduler::ClassSlo {
                ttft_ms: 1e9,
                itl_ms: 1e9,
                e2e_ms: f64::INFINITY,
            },
            ..SloConfig::default()
        }),
        ..workload()
    };
    let strict = Workload {
        slo: SloConfig {
            short: crate::scheduler::ClassSlo {
                ttft_ms: 1e-3,
                itl_ms: 1e-3,
                e2e_ms: f64::INFINITY,
            },
            ..SloConfig::default()
        },
        ..w.clone()
    };
    // The scheduler's targets are impossible, the judge's lenient: every finished short
    // request counts as met.
    let r = simulate(&strict, Policy::Fcfs, 8.0, None).unwrap();
    let short = &r.classes["short"];
    assert_eq!(
        short.attained + short.rejected + short.unfinished,
        short.requests
    );
    let e2e = short.e2e_ms.unwrap();
    let ttft = short.ttft_ms.unwrap();
    assert!(e2e.p50 > ttft.p50 && e2e.p99 >= e2e.p95 && e2e.p95 >= e2e.p50);
    // Without a judge the targets are the criterion.
    let r = simulate(
        &Workload {
            judge: None,
            ..strict
        },
        Policy::Fcfs,
        8.0,
        None,
    )
    .unwrap();
    assert_eq!(r.classes["short"].attained, 0);
}

/// Lookahead decode modelled (`--lookahead`): one request at a time, nearly every prediction
/// is kept and most misses come when a request ends, on a GPU left idle (nothing wasted);
/// under churn, launching every prediction wastes more than it saves, and the gate ("auto")
/// holds nearly all of them back. Requests run to their drawn lengths either way.
#[test]
fn lookahead_pays_alone_and_the_gate_holds_it_back_under_churn() {
    use crate::simulate::lookahead::LookaheadSetup;
    let w = workload();
    let run = |w: &Workload, rate, gated| {
        let setup = LookaheadSetup {
            gain_us: 20.0,
            gated,
        };
        run_once(w, Policy::Adaptive, rate, Some(setup)).unwrap()
    };
    let alone = Workload {
        duration_s: 2_000.0,
        ..w.clone()
    };
    for gated in [false, true] {
        let r = run(&alone, 0.02, gated);
        let la = r.lookahead.unwrap();
        assert!(la.launched > 1_000 && la.hit_rate() > 0.95, "{la:?}");
        // Poisson arrivals overlap now and then: a join.
        assert!(la.missed["left"] * 10 >= la.missed_total() * 9, "{la:?}");
        assert!(la.held * 10 < la.launched, "{la:?}");
        assert!(la.wasted_s * 2.0 < la.saved_s, "{la:?}");
    }
    let (on, auto) = (run(&w, 8.0, false), run(&w, 8.0, true));
    let (la_on, la_auto) = (
        on.lookahead.clone().unwrap(),
        auto.lookahead.clone().unwrap(),
    );
    assert!(la_on.wasted_s > 3.0 * la_on.saved_s, "{la_on:?}");
    assert!(la_on.missed["joined"] > 0 && la_on.missed["left"] > 0);
    assert!(
        la_auto.launched * 10 < la_on.launched && la_auto.held > la_auto.launched,
        "{la_auto:?}"
    );
    assert!(la_auto.wasted_s * 10.0 < la_on.wasted_s, "{la_auto:?}");
    let reqs = w.requests(8.0).unwrap();
    for run in [&on, &auto] {
        for (r, rec) in reqs.iter().zip(&run.records) {
            assert!(rec.rejected || rec.output_tokens == r.output_tokens);
        }
    }
}

/// The lookahead table lists the runs that modelled it, labelled by how.
#[test]
fn lookahead_table_lists_the_modelled_runs() {
    use crate::simulate::lookahead::LookaheadSetup;
    let w = workload();
    let mut reports = vec![simulate(&w, Policy::Fcfs, 8.0, None).unwrap()];
    for gated in [false, true] {
        let setup = LookaheadSetup {
            gain_us: 20.0,
            gated,
        };
        reports.push(simulate(&w, Policy::Fcfs, 8.0, Some(setup)).unwrap());
    }
    let main = report::table(&reports);
    assert_eq!(main.lines().count(), 4, "{main}");
    assert!(main.contains(" fcfs+la ") && main.contains(" fcfs+la-auto "));
    let la = report::lookahead_table(&reports);
    let rows: Vec<&str> = la.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{la}");
    assert!(rows[0].contains(" fcfs+la ") && rows[1].contains(" fcfs+la-auto "));
    assert!(reports[0].lookahead.is_none());
    let json = serde_json::to_string(&reports[0]).unwrap();
    assert!(
        !json.contains("lookahead"),
        "runs without it keep their JSON"
    );
}

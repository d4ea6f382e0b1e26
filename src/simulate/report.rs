//! Figures of a simulated run: SLO attainment overall and per class, latency percentiles,
//! goodput and throughput, and the scheduler's counters.
//!
//! A request attains its SLO only if it finished, its TTFT is within its class's `ttft_ms` and
//! its mean inter-token latency (time per output token after the first) within `itl_ms`. A
//! rejected or unfinished request counts as missed.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::scheduler::slo::percentile;
use crate::scheduler::{CostCoefficients, MergeReason, OverloadReason, RequestClass, SloConfig};
use crate::simulate::lookahead::LookaheadReport;
use crate::simulate::sim::{RequestRecord, SimRun};

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Percentiles {
    /// Over `values` (ms); None when empty.
    fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        Some(Percentiles {
            p50: percentile(&mut values, 0.50),
            p95: percentile(&mut values, 0.95),
            p99: percentile(&mut values, 0.99),
        })
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClassReport {
    pub requests: usize,
    pub attained: usize,
    /// attained / requests.
    pub attainment: f64,
    pub rejected: usize,
    pub unfinished: usize,
    /// Finished requests over their TTFT SLO, and over their ITL SLO (a request may be both).
    pub missed_ttft: usize,
    pub missed_itl: usize,
    /// TTFT of the requests that got a first token, ms.
    pub ttft_ms: Option<Percentiles>,
    /// Every inter-token gap, ms.
    pub itl_ms: Option<Percentiles>,
    /// Arrival to last token of the finished requests, ms.
    pub e2e_ms: Option<Percentiles>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunReport {
    pub workload: String,
    pub policy: &'static str,
    /// Offered load, requests/s.
    pub rate: f64,
    pub overall: ClassReport,
    pub classes: BTreeMap<&'static str, ClassReport>,
    /// Requests that attained their SLOs per second of the arrival window.
    pub goodput_rps: f64,
    /// Output tokens per simulated second, until the last request finished.
    pub output_tokens_per_s: f64,
    /// Prompt and output tokens of finished requests per simulated second.
    pub total_tokens_per_s: f64,
    pub makespan_s: f64,
    pub steps: u64,
    pub preemptions: u64,
    pub emergency_entries: u64,
    pub emergency_pauses: u64,
    pub merge_decisions: BTreeMap<&'static str, u64>,
    pub overloaded: BTreeMap<&'static str, u64>,
    /// The scheduler's step-time model at the end of the run.
    pub fitted_cost: CostCoefficients,
    /// Lookahead decode's figures, when modelled (`--lookahead`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lookahead: Option<LookaheadReport>,
}

/// (TTFT within SLO, ITL within SLO) of a finished request; None for a rejected or
/// unfinished one.
fn slo_checks(r: &RequestRecord, slo: &SloConfig) -> Option<(bool, bool)> {
    let class = r.class?;
    if r.rejected || r.finished_s.is_none() {
        return None;
    }
    let s = slo.of(class);
    Some((
        r.ttft_s().is_some_and(|t| t * 1e3 <= s.ttft_ms),
        r.mean_itl_s().is_none_or(|t| t * 1e3 <= s.itl_ms),
    ))
}

fn class_report<'a>(
    records: impl Iterator<Item = &'a RequestRecord>,
    slo: &SloConfig,
) -> ClassReport {
    let (mut n, mut attained, mut rejected, mut unfinished) = (0, 0, 0, 0);
    let (mut missed_ttft, mut missed_itl) = (0, 0);
    let (mut ttft, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
    for r in records {
        n += 1;
        if let Some((ttft_ok, itl_ok)) = slo_checks(r, slo) {
            attained += usize::from(ttft_ok && itl_ok);
            missed_ttft += usize::from(!ttft_ok);
            missed_itl += usize::from(!itl_ok);
        }
        rejected += usize::from(r.rejected);
        unfinished += usize::from(!r.rejected && r.finished_s.is_none());
        ttft.extend(r.ttft_s().map(|t| t * 1e3));
        itl.extend(r.itl_s.iter().map(|t| t * 1e3));
        if r.finished_s.is_some() {
            e2e.extend(r.last_token_s.map(|t| (t - r.arrival_s) * 1e3));
        }
    }
    ClassReport {
        requests: n,
        attained,
        attainment: if n == 0 {
            1.0
        } else {
            attained as f64 / n as f64
        },
        rejected,
        unfinished,
        missed_ttft,
        missed_itl,
        ttft_ms: Percentiles::of(ttft),
        itl_ms: Percentiles::of(itl),
        e2e_ms: Percentiles::of(e2e),
    }
}

pub fn report(workload: &str, duration_s: f64, slo: &SloConfig, run: &SimRun) -> RunReport {
    let overall = class_report(run.records.iter(), slo);
    let classes = RequestClass::ALL
        .iter()
        .map(|&c| {
            let rep = class_report(run.records.iter().filter(|r| r.class == Some(c)), slo);
            (c.as_str(), rep)
        })
        .collect();
    let out_tokens: usize = run.records.iter().map(|r| r.output_tokens).sum();
    let total_tokens: usize = run
        .records
        .iter()
        .filter(|r| r.finished_s.is_some())
        .map(|r| r.prompt_tokens + r.output_tokens)
        .sum();
    let span = run.makespan_s.max(1e-9);
    let s = &run.stats;
    RunReport {
        workload: workload.to_string(),
        policy: run.policy.as_str(),
        rate: run.rate,
        goodput_rps: overall.attained as f64 / duration_s,
        overall,
        classes,
        output_tokens_per_s: out_tokens as f64 / span,
        total_tokens_per_s: total_tokens as f64 / span,
        makespan_s: run.makespan_s,
        steps: run.steps,
        preemptions: s.preemptions,
        emergency_entries: s.emergency_entries,
        emergency_pauses: s.emergency_pauses,
        merge_decisions: MergeReason::ALL
            .iter()
            .map(|&r| (r.as_str(), s.merge_count(r)))
            .collect(),
        overloaded: OverloadReason::ALL
            .iter()
            .map(|&r| (r.as_str(), s.overloaded_count(r)))
            .collect(),
        fitted_cost: run.fitted_cost,
        lookahead: run.lookahead.clone(),
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn ms(p: Option<Percentiles>, f: impl Fn(Percentiles) -> f64) -> String {
    p.map_or("-".into(), |p| format!("{:.0}", f(p)))
}

/// One line per run, widths fixed for a terminal.
pub fn table(reports: &[RunReport]) -> String {
    let mut s =
        format!(
        "{:>6} {:>13} | {:>7} {:>7} {:>7} {:>7} | {:>19} | {:>14} | {:>8} {:>9} {:>6} {:>7} {:>5}\n",
        "rate", "policy", "SLO", "short", "medium", "long", "short TTFT p50/95/99", "ITL p50/95/99",
        "goodput", "out tok/s", "reject", "preempt", "emerg"
    );
    for r in reports {
        let short = &r.classes["short"];
        let t = short.ttft_ms;
        s += &format!(
            concat!(
                "{:>6.2} {:>13} | {:>7} {:>7} {:>7} {:>7} | {:>19} | {:>14} ",
                "| {:>8.2} {:>9.0} {:>6} {:>7} {:>5}\n"
            ),
            r.rate,
            policy_label(r),
            pct(r.overall.attainment),
            pct(short.attainment),
            pct(r.classes["medium"].attainment),
            pct(r.classes["long"].attainment),
            format!(
                "{}/{}/{}",
                ms(t, |p| p.p50),
                ms(t, |p| p.p95),
                ms(t, |p| p.p99)
            ),
            format!(
                "{}/{}/{}",
                ms(r.overall.itl_ms, |p| p.p50),
                ms(r.overall.itl_ms, |p| p.p95),
                ms(r.overall.itl_ms, |p| p.p99)
            ),
            r.goodput_rps,
            r.output_tokens_per_s,
            r.overall.rejected,
            r.preemptions,
            r.emergency_entries,
        );
    }
    s
}

/// The policy, "+la" when lookahead decode was modelled, "+la-auto" when gated.
fn policy_label(r: &RunReport) -> String {
    match &r.lookahead {
        Some(la) if la.gated => format!("{}+la-auto", r.policy),
        Some(_) => format!("{}+la", r.policy),
        None => r.policy.to_string(),
    }
}

/// One line per run with lookahead modelled: steps launched ahead, kept, missed and why, steps
/// not foreseen and why, and the time saved and wasted.
pub fn lookahead_table(reports: &[RunReport]) -> String {
    let mut s = format!(
        "{:>6} {:>13} | {:>8} {:>6} {:>6} | {:>34} | {:>28} | {:>8} {:>8} {:>9}\n",
        "rate",
        "policy",
        "launched",
        "kept",
        "held",
        "missed: left/joined/table/other",
        "unforeseen: block/last/chunk",
        "saved s",
        "wasted s",
        "net ms/s"
    );
    for r in reports {
        let Some(la) = &r.lookahead else { continue };
        let m = |k| la.missed.get(k).copied().unwrap_or(0);
        let u = |k| la.unforeseen.get(k).copied().unwrap_or(0);
        s += &format!(
            "{:>6.2} {:>13} | {:>8} {:>6} {:>6} | {:>34} | {:>28} | {:>8.3} {:>8.3} {:>9.2}\n",
            r.rate,
            policy_label(r),
            la.launched,
            pct(la.hit_rate()),
            la.held,
            format!(
                "{}/{}/{}/{}",
                m("left"),
                m("joined"),
                m("table_or_counts"),
                m("other")
            ),
            format!(
                "{}/{}/{}",
                u("needs_block"),
                u("last_token"),
                u("no_sample")
            ),
            la.saved_s,
            la.wasted_s,
            (la.saved_s - la.wasted_s) * 1e3 / r.makespan_s.max(1e-9),
        );
    }
    s
}

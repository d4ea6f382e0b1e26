//! SLO monitor: sliding-window percentiles of TTFT and ITL per request class, and the emergency
//! mode they drive (adaptive policy).
//!
//! Emergency mode starts when any class's P95 (of TTFT or ITL) exceeds that class's SLO, and
//! ends once every P95 has stayed under `exit_ratio` × its SLO for `exit_hold_s`. The monitor
//! keeps a running estimate of how long a period lasts (entry to exit, so never less than
//! `exit_hold_s`): the pause guard weighs a pause by it. Windows hold
//! the last `window_s` seconds, at most `max_samples` samples each, so memory is bounded however
//! many tokens flow.

use std::collections::VecDeque;

use serde::Serialize;

use crate::scheduler::{EmergencyConfig, RequestClass, SloConfig};

/// Weight of the latest period in the running mean of emergency durations: periods are few (a
/// handful a minute at most), so the estimate follows the recent ones.
const DURATION_EMA_ALPHA: f64 = 0.5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SloMetric {
    Ttft,
    Itl,
}

impl SloMetric {
    pub fn as_str(self) -> &'static str {
        match self {
            SloMetric::Ttft => "ttft",
            SloMetric::Itl => "itl",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EmergencyTransition {
    /// The first breach found: class, metric, its P95 and the SLO.
    Entered {
        class: RequestClass,
        metric: SloMetric,
        p95_ms: f64,
        slo_ms: f64,
    },
    Left,
}

#[derive(Debug, Default, Clone)]
struct Window {
    /// (time in seconds, value in ms), oldest first.
    samples: VecDeque<(f64, f64)>,
}

#[derive(Debug, Clone)]
pub struct SloMonitor {
    cfg: EmergencyConfig,
    slo: SloConfig,
    /// [class][metric]
    windows: [[Window; 2]; 3],
    emergency: bool,
    /// While in emergency mode: since when every P95 has been under its exit bound.
    calm_since: Option<f64>,
    last_eval: Option<f64>,
    /// When the current emergency period started.
    entered_at: Option<f64>,
    /// Running mean (EMA) of the periods' durations, seconds; None before one has ended.
    mean_duration_s: Option<f64>,
    /// Last evaluated percentiles, [class][metric] (None: too few samples).
    last: [[Option<f64>; 2]; 3],
    scratch: Vec<f64>,
}

impl SloMonitor {
    pub fn new(cfg: EmergencyConfig, slo: SloConfig) -> Self {
        SloMonitor {
            cfg,
            slo,
            windows: Default::default(),
            emergency: false,
            calm_since: None,
            last_eval: None,
            entered_at: None,
            mean_duration_s: None,
            last: [[None; 2]; 3],
            scratch: Vec::new(),
        }
    }

    pub fn in_emergency(&self) -> bool {
        self.emergency
    }

    /// How long an emergency period is expected to last, seconds: the running mean of the
    /// periods that ended, and `exit_hold_s` (the least a period can last) before any did.
    pub fn expected_duration_s(&self) -> f64 {
        self.mean_duration_s
            .unwrap_or(0.0)
            .max(self.cfg.exit_hold_s)
    }

    pub fn record(&mut self, class: RequestClass, metric: SloMetric, now: f64, value_ms: f64) {
        let w = &mut self.windows[class.index()][metric as usize];
        if w.samples.len() >= self.cfg.max_samples {
            w.samples.pop_front();
        }
        w.samples.push_back((now, value_ms));
    }

    /// The percentile of the last evaluation, if the window had enough samples.
    pub fn percentile_ms(&self, class: RequestClass, metric: SloMetric) -> Option<f64> {
        self.last[class.index()][metric as usize]
    }

    /// Re-evaluates the windows at most every `eval_interval_s`; returns a mode change.
    pub fn evaluate(&mut self, now: f64) -> Option<EmergencyTransition> {
        if self
            .last_eval
            .is_some_and(|t| now - t < self.cfg.eval_interval_s)
        {
            return None;
        }
        self.last_eval = Some(now);
        let mut breach = None;
        let mut calm = true;
        for class in RequestClass::ALL {
            let slo = self.slo.of(class);
            for (metric, slo_ms) in [(SloMetric::Ttft, slo.ttft_ms), (SloMetric::Itl, slo.itl_ms)] {
                let p = self.window_percentile(class, metric, now);
                self.last[class.index()][metric as usize] = p;
                let Some(p) = p else { continue };
                if p > slo_ms && breach.is_none() {
                    breach = Some(EmergencyTransition::Entered {
                        class,
                        metric,
                        p95_ms: p,
                        slo_ms,
                    });
                }
                calm &= p <= self.cfg.exit_ratio * slo_ms;
            }
        }
        if !self.emergency {
            if breach.is_some() {
                self.emergency = true;
                self.calm_since = None;
                self.entered_at = Some(now);
            }
            return breach;
        }
        if !calm {
            self.calm_since = None;
            return None;
        }
        let since = *self.calm_since.get_or_insert(now);
        if now - since >= self.cfg.exit_hold_s {
            self.emergency = false;
            self.calm_since = None;
            if let Some(start) = self.entered_at.take() {
                let d = now - start;
                self.mean_duration_s = Some(match self.mean_duration_s {
                    Some(m) => m + DURATION_EMA_ALPHA * (d - m),
                    None => d,
                });
            }
            return Some(EmergencyTransition::Left);
        }
        None
    }

    fn window_percentile(
        &mut self,
        class: RequestClass,
        metric: SloMetric,
        now: f64,
    ) -> Option<f64> {
        let w = &mut self.windows[class.index()][metric as usize];
        while w
            .samples
            .front()
            .is_some_and(|&(t, _)| now - t > self.cfg.window_s)
        {
            w.samples.pop_front();
        }
        if w.samples.len() < self.cfg.min_samples.max(1) {
            return None;
        }
        self.scratch.clear();
        self.scratch.extend(w.samples.iter().map(|&(_, v)| v));
        Some(percentile(&mut self.scratch, self.cfg.percentile))
    }
}

/// Nearest-rank percentile (`q` in (0, 1)) of a non-empty slice, reordering it.
pub fn percentile(values: &mut [f64], q: f64) -> f64 {
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
    let (_, v, _) = values.select_nth_unstable_by(rank, f64::total_cmp);
    *v
}

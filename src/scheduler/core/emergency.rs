//! Emergency mode (`adaptive` with `emergency.enabled`): the SLO monitor's transitions, and the
//! pause of long sequences on entry (see `scheduler::slo` and the module docs of `core`).

use super::{Scheduler, StepPlan};
use crate::kv::KvCacheManager;
use crate::scheduler::request::Request;
use crate::scheduler::slo::EmergencyTransition;
use crate::scheduler::RequestClass;

impl Scheduler {
    /// Evaluates the SLO monitor; on entering emergency mode, pauses the long sequences.
    pub(super) fn update_emergency(
        &mut self,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
        now: f64,
    ) {
        match self.monitor.evaluate(now) {
            Some(EmergencyTransition::Entered {
                class,
                metric,
                p95_ms,
                slo_ms,
            }) => {
                self.stats.count_breach(class, metric);
                tracing::debug!(
                    class = class.as_str(),
                    metric = metric.as_str(),
                    p95_ms,
                    slo_ms,
                    "emergency mode entered"
                );
                self.pause_long_sequences(plan, kv, class, now);
            }
            Some(EmergencyTransition::Left) => {
                self.stats.emergency_exits += 1;
                for req in self.requests.values_mut() {
                    req.paused = false;
                }
                tracing::debug!("emergency mode left");
            }
            None => {}
        }
    }

    /// Pauses (preempts, their full blocks staying in the prefix cache) the running sequences
    /// longer than `pause_length_factor` × the running batch's mean length, once each. A pause
    /// frees memory and step time for the others, so it spares the class whose SLO broke: pausing
    /// it would only deepen its own breach. It also spares a sequence the pause alone would make
    /// miss its own SLO (`pause_breaks_own_slo`): trading one request's SLO for the others' is
    /// no gain when each counts the same.
    fn pause_long_sequences(
        &mut self,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
        breached: RequestClass,
        now: f64,
    ) {
        if self.running.is_empty() {
            return;
        }
        let total: usize = self
            .running
            .iter()
            .map(|id| self.requests[id].num_tokens())
            .sum();
        let limit =
            self.cfg.emergency.pause_length_factor * total as f64 / self.running.len() as f64;
        let step_ms = self.decode_step_ms();
        let mut victims = Vec::new();
        for &id in &self.running {
            let r = &self.requests[&id];
            if r.num_tokens() as f64 <= limit || r.was_paused || r.class == breached {
                continue;
            }
            if self.pause_breaks_own_slo(r, now, step_ms) {
                self.stats.emergency_pauses_spared += 1;
                tracing::debug!(%id, tokens = r.num_tokens(), "spared by emergency mode");
                continue;
            }
            victims.push(id);
        }
        for id in victims {
            self.running.retain(|&r| r != id);
            self.preempt(id, kv);
            let req = self
                .requests
                .get_mut(&id)
                .expect("running requests are known");
            req.paused = true;
            req.was_paused = true;
            plan.preempted.push(id);
            self.stats.emergency_pauses += 1;
            tracing::debug!(%id, tokens = req.num_tokens(), "paused by emergency mode");
        }
    }

    /// Whether pausing `r` at `now` would by itself make it miss its SLO. A pause lasts as long
    /// as the emergency period: the monitor's running estimate of how long periods have lasted
    /// (`exit_hold_s`, the least one can last, before any ended); then it recomputes what it has
    /// and, if it has started, generates the output expected of it at `step_ms` a token: the
    /// TTFT it would reach, or else the mean ITL, against its class's SLO.
    fn pause_breaks_own_slo(&self, r: &Request, now: f64, step_ms: f64) -> bool {
        let slo = self.cfg.slo.of(r.class);
        let per_step = self.prefill_budget(r.class);
        let delay_ms =
            self.monitor.expected_duration_s() * 1e3 + self.prefill_ms(r.num_tokens(), per_step);
        let Some(first) = r.first_token_at else {
            return (now - r.arrival) * 1e3 + delay_ms > slo.ttft_ms;
        };
        let remaining = self.expected_remaining_output(r);
        let gaps = (r.num_output_tokens() + remaining).saturating_sub(1).max(1);
        let decode_ms = (now - first) * 1e3 + delay_ms + remaining as f64 * step_ms;
        decode_ms / gaps as f64 > slo.itl_ms
    }
}

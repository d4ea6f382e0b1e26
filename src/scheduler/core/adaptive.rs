//! The `adaptive` policy: every decode first (preempting the lowest-priority request not yet in
//! the step when blocks run out), then prefill candidates lane by lane, each fused into the step
//! only when `policy::should_merge` allows it (see `scheduler::policy`).

use foldhash::{HashSet, HashSetExt};

use super::{Scheduler, StepPlan};
use crate::kv::KvCacheManager;
use crate::request::RequestId;
use crate::scheduler::policy::{
    should_merge, Candidate, Lane, MergeContext, MergeDecision, MergeReason, StepDraft,
};
use crate::scheduler::request::{Request, Status};
use crate::scheduler::RequestClass;

/// Candidate slots in the order a step serves them. Slot 0 holds medium and long requests
/// promoted for their own TTFT deadline (`overdue`).
const NUM_SLOTS: usize = 5;

fn lane_slot(lane: Lane) -> usize {
    match lane {
        Lane::FastLane => 1,
        Lane::Resumed => 2,
        Lane::Normal => 3,
        Lane::LongStream | Lane::Decode => 4,
    }
}

/// Candidates by slot; within one, running (older) before waiting, each in queue order. The
/// bool: already running.
type Lanes = [Vec<(RequestId, bool)>; NUM_SLOTS];

/// What the prefill passes of one step carry from one candidate to the next.
struct MergeState {
    /// The step so far, and with its decodes only (a waiting short prompt's own step).
    draft: StepDraft,
    decode_only: StepDraft,
    /// KV blocks new admissions may still take (`kv_headroom`).
    headroom: f64,
    /// How much longer this step may get before a waiting short prompt misses its TTFT.
    short_slack_ms: f64,
    /// Long-prompt tokens left under `long_prefill_budget`.
    long_left: usize,
    max_len: usize,
    /// Waiting requests that joined the step (they leave the waiting queue at the end).
    admitted_now: HashSet<RequestId>,
    /// The prefix hit `try_load` looked up for the candidate at hand.
    lookup: Option<usize>,
    /// The document whose deadline needs a chunk in this step (`most_due`), until it has one.
    due: Option<RequestId>,
}

/// Whether the walk over a lane goes on.
enum Next {
    Candidate,
    Lane,
}

impl Scheduler {
    /// The adaptive step: every decode, then prefill candidates lane by lane through
    /// `should_merge`.
    pub(super) fn schedule_adaptive(
        &mut self,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
        now: f64,
    ) {
        let paused_before = plan.preempted.len();
        let draft = self.schedule_decodes(plan, kv, now);
        // Preempted for memory: admit nothing new this step (pauses freed memory on purpose).
        let admit = plan.preempted.len() == paused_before;
        let mut lanes = self.candidate_lanes(admit, now);
        let lost = if self.cfg.merge.edf_documents {
            self.order_documents_by_deadline(&mut lanes, &draft, now)
        } else {
            HashSet::new()
        };
        let mut st = MergeState {
            draft,
            decode_only: draft,
            headroom: self.kv_headroom(kv),
            short_slack_ms: f64::INFINITY,
            long_left: self.cfg.classes.long_prefill_budget,
            max_len: self.max_len(kv),
            admitted_now: HashSet::new(),
            lookup: None,
            due: self.most_due(&draft, now, &lost),
        };
        for (slot, lane_ids) in lanes.iter().enumerate() {
            for &(id, is_running) in lane_ids {
                if plan.budget == 0 {
                    self.stats.count_merge(MergeReason::TokenBudget);
                    break;
                }
                if let Next::Lane = self.consider(&mut st, plan, kv, now, slot, id, is_running) {
                    break;
                }
            }
        }
        if !st.admitted_now.is_empty() {
            self.waiting.retain(|id| !st.admitted_now.contains(id));
        }
    }

    /// Running requests with prompt left, then (when `admit`) waiting ones, by slot.
    fn candidate_lanes(&self, admit: bool, now: f64) -> Lanes {
        let mut lanes: Lanes = Default::default();
        for &id in &self.running {
            let r = &self.requests[&id];
            if !r.loading && r.num_schedulable() > 1 {
                let lane = Lane::of_prefill(r.class);
                let slot = if self.overdue(r, now) {
                    0
                } else {
                    lane_slot(lane)
                };
                lanes[slot].push((id, true));
            }
        }
        if admit {
            // Paused requests wait while emergency mode lasts and others run; with nothing
            // running a pause frees nothing, and the engine must not idle with work queued.
            let hold_paused = self.monitor.in_emergency() && !self.running.is_empty();
            for &id in &self.waiting {
                let r = &self.requests[&id];
                if r.paused && hold_paused {
                    continue;
                }
                let slot = if r.num_output_tokens() > 0 {
                    lane_slot(Lane::Resumed)
                } else if self.overdue(r, now) {
                    0
                } else {
                    lane_slot(Lane::of_prefill(r.class))
                };
                lanes[slot].push((id, false));
            }
        }
        lanes
    }

    /// `merge.edf_documents`: the normal and long lanes' candidates as one queue in the normal
    /// lane's slot, by TTFT deadline, then the lost causes by arrival. A document is lost when
    /// its remaining prefill, queued behind the earlier-deadline documents kept (each
    /// predicted chunk by chunk as steps alone with the decodes), would end past its deadline:
    /// under overload plain EDF lets every document slip a little until all are late (the
    /// domino effect), while this keeps the ones that can make it on time and serves the rest
    /// from what they leave. A document already past its first token (resumed) keeps its place
    /// ahead: its TTFT is behind it. Returns the lost ones (`most_due` skips them).
    fn order_documents_by_deadline(
        &self,
        lanes: &mut Lanes,
        decodes: &StepDraft,
        now: f64,
    ) -> HashSet<RequestId> {
        let normal = lane_slot(Lane::Normal);
        let mut docs = std::mem::take(&mut lanes[normal]);
        docs.append(&mut lanes[lane_slot(Lane::LongStream)]);
        let left_ms = |r: &Request| (r.arrival - now) * 1e3 + self.cfg.slo.of(r.class).ttft_ms;
        let key = |id: &RequestId| {
            let r = &self.requests[id];
            if r.num_output_tokens() > 0 {
                (0, r.arrival)
            } else {
                (1, left_ms(r))
            }
        };
        docs.sort_by(|a, b| {
            let (ka, kb) = (key(&a.0), key(&b.0));
            ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
        });
        let (mut kept, mut lost) = (Vec::with_capacity(docs.len()), Vec::new());
        let mut queued_ms = 0.0;
        for c in docs {
            let r = &self.requests[&c.0];
            if r.num_output_tokens() > 0 {
                kept.push(c);
                continue;
            }
            let room = left_ms(r) - queued_ms;
            let need = if room > 0.0 {
                self.prefill_need_ms(r, decodes, room)
            } else {
                f64::INFINITY
            };
            if need < room {
                queued_ms += need;
                kept.push(c);
            } else {
                lost.push(c);
            }
        }
        lost.sort_by(|a, b| {
            self.requests[&a.0]
                .arrival
                .total_cmp(&self.requests[&b.0].arrival)
        });
        let lost_ids = lost.iter().map(|c| c.0).collect();
        kept.append(&mut lost);
        lanes[normal] = kept;
        lost_ids
    }

    /// Free blocks above the watermark, less what the running requests are expected to grow
    /// into, scaled by `kv_threshold`: what new admissions may take.
    fn kv_headroom(&self, kv: &KvCacheManager) -> f64 {
        let watermark = (self.cfg.merge.kv_watermark * kv.num_blocks() as f64).ceil();
        let reserved: usize = self
            .running
            .iter()
            .map(|id| self.expected_growth_blocks(*id, kv))
            .sum();
        (kv.num_free_blocks() as f64 - watermark - reserved as f64).max(0.0)
            * self.cfg.merge.kv_threshold
    }

    /// One prefill candidate: merged into the step, or left for a later one.
    #[allow(clippy::too_many_arguments)]
    fn consider(
        &mut self,
        st: &mut MergeState,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
        now: f64,
        slot: usize,
        id: RequestId,
        is_running: bool,
    ) -> Next {
        let lane = if slot == lane_slot(Lane::Resumed) {
            Lane::Resumed
        } else {
            Lane::of_prefill(self.requests[&id].class)
        };
        if !is_running && self.drop_unschedulable(id, st.max_len, plan, kv) {
            return Next::Candidate;
        }
        if !is_running && !self.try_load(st, plan, kv, id) {
            return Next::Candidate;
        }
        if lane == Lane::LongStream && st.long_left == 0 {
            self.stats.count_merge(MergeReason::LongBudget);
            // The promoted slot (and the documents' slot under `edf_documents`) mixes classes:
            // a medium request behind may still fit.
            return if slot != lane_slot(Lane::LongStream) {
                Next::Candidate
            } else {
                Next::Lane
            };
        }
        let num_computed = if is_running {
            self.requests[&id].num_computed
        } else {
            st.lookup.take().unwrap_or(0)
        };
        let req = &self.requests[&id];
        let mut cand = self.candidate(req, lane, is_running, num_computed, st.long_left, kv);
        cand.due = st.due == Some(id);
        let decision = self.decide(st, plan, kv, id, &cand, is_running);
        if decision.reason.merged() {
            self.take(st, plan, id, &cand, decision, is_running);
        } else if lane == Lane::FastLane && !is_running {
            self.note_short_slack(st, id, num_computed, now);
        }
        Next::Candidate
    }

    /// A waiting candidate whose blocks come back from the host tier (swapped, or a prefix hit
    /// there) is admitted here, without a merge decision: it computes nothing this step, only
    /// takes its slot and its blocks (`loading`). True when it is an ordinary candidate, its
    /// prefix hit left in `st.lookup`.
    fn try_load(
        &mut self,
        st: &mut MergeState,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
        id: RequestId,
    ) -> bool {
        let slots = self.requests[&id].slots();
        let has_slot = self.slots_used() + slots <= self.cfg.max_num_seqs;
        let loaded = if self.requests[&id].swapped_computed.is_some() {
            has_slot && self.resume_swapped(id, plan, kv)
        } else {
            let hit = self.lookup_prefix(id, kv);
            if kv.num_host_hit_blocks(id) == 0 {
                st.lookup = Some(hit);
                return true;
            }
            has_slot && self.admit_loading(id, hit, plan, kv)
        };
        if loaded {
            st.admitted_now.insert(id);
            let growth = self.expected_growth_blocks(id, kv);
            st.headroom = (st.headroom - growth as f64).max(0.0);
        }
        false
    }

    /// What a request asks of this step in its lane.
    fn candidate(
        &self,
        req: &Request,
        lane: Lane,
        is_running: bool,
        num_computed: usize,
        long_left: usize,
        kv: &KvCacheManager,
    ) -> Candidate {
        let uncomputed = req.compute_target() - num_computed;
        let wanted = match lane {
            Lane::FastLane | Lane::Decode => uncomputed,
            Lane::Resumed | Lane::Normal => self.capped_chunk(uncomputed),
            Lane::LongStream => uncomputed.min(long_left),
        };
        // The fast lane admits a prompt whole, unless it exceeds the whole step budget (a small
        // budget with a large short_below): then it is chunked like the rest.
        let min_tokens = if lane == Lane::FastLane && wanted <= self.cfg.max_num_batched_tokens {
            wanted
        } else {
            // Never more than a whole step's budget, or nothing could ever fit.
            wanted.min(
                self.cfg
                    .merge
                    .min_chunk_tokens
                    .clamp(1, self.cfg.max_num_batched_tokens.max(1)),
            )
        };
        let kv_blocks_needed = if is_running {
            0
        } else {
            let growth = self.expected_remaining_output(req);
            (req.num_tokens() + growth).div_ceil(kv.block_size()) - num_computed / kv.block_size()
        };
        Candidate {
            lane,
            num_computed,
            wanted,
            min_tokens,
            kv_blocks_needed,
            due: false,
        }
    }

    /// `should_merge`, then the blocks for what it grants; counted and logged.
    fn decide(
        &mut self,
        st: &MergeState,
        plan: &StepPlan,
        kv: &mut KvCacheManager,
        id: RequestId,
        cand: &Candidate,
        is_running: bool,
    ) -> MergeDecision {
        let ctx = MergeContext {
            token_budget_left: plan.budget,
            seq_available: is_running
                || self.slots_used() + self.requests[&id].slots() <= self.cfg.max_num_seqs,
            kv_headroom_blocks: st.headroom,
            running_is_empty: self.running.is_empty(),
            short_ttft_slack_ms: if cand.lane == Lane::FastLane {
                f64::INFINITY
            } else {
                st.short_slack_ms
            },
            doc_floor_ms: self.cost.predict_ms(&st.decode_only.features)
                + self.cfg.merge.doc_step_ms,
        };
        let mut decision = should_merge(&self.cost, &self.cfg.merge, &st.draft, cand, &ctx);
        if decision.reason.merged()
            && kv
                .allocate_slots(id, cand.num_computed, decision.tokens)
                .is_none()
        {
            decision.reason = MergeReason::KvAllocation;
        }
        self.stats.count_merge(decision.reason);
        tracing::debug!(
            %id,
            lane = cand.lane.as_str(),
            reason = decision.reason.as_str(),
            wanted = cand.wanted,
            tokens = decision.tokens,
            "merge decision"
        );
        decision
    }

    /// A short prompt left waiting runs in the next step: what this step may still add is
    /// bounded by its TTFT deadline, less its own prefill step after this one.
    fn note_short_slack(&self, st: &mut MergeState, id: RequestId, num_computed: usize, now: f64) {
        let req = &self.requests[&id];
        let mut alone = st.decode_only.features;
        alone.add_seq(req.num_tokens() - num_computed, req.num_tokens());
        let deadline_ms = (req.arrival - now) * 1e3 + self.cfg.slo.short.ttft_ms;
        st.short_slack_ms = st
            .short_slack_ms
            .min(deadline_ms - self.cost.predict_ms(&alone));
    }

    /// Adds a merged candidate's `tokens` to the step; a waiting one starts running.
    fn take(
        &mut self,
        st: &mut MergeState,
        plan: &mut StepPlan,
        id: RequestId,
        cand: &Candidate,
        decision: MergeDecision,
        is_running: bool,
    ) {
        let (tokens, reason) = (decision.tokens, decision.reason);
        st.draft.add_prefill(cand.num_computed, tokens);
        if reason == MergeReason::Deadline {
            st.due = None;
        }
        plan.push(id, tokens, 0);
        if cand.lane == Lane::LongStream {
            st.long_left = st.long_left.saturating_sub(tokens);
        }
        if !is_running {
            st.headroom = (st.headroom - cand.kv_blocks_needed as f64).max(0.0);
            st.admitted_now.insert(id);
            self.start_running(id, cand.num_computed, plan);
        }
    }

    /// Allocates every decode's slot (and its draft positions when it speculates and they fit),
    /// preempting the lowest-priority running request not yet in the step when blocks run out.
    /// Each decode bounds the step by its ITL slack (`itl_step_bound_ms`).
    fn schedule_decodes(
        &mut self,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
        now: f64,
    ) -> StepDraft {
        let max_len = self.max_len(kv);
        let mut draft = StepDraft::new();
        let mut in_step: HashSet<RequestId> = HashSet::with_capacity(self.running.len() + 8);
        let decodes: Vec<RequestId> = self
            .running
            .iter()
            .copied()
            .filter(|id| {
                let r = &self.requests[id];
                !r.loading && r.num_schedulable() == 1
            })
            .collect();
        for id in decodes {
            if plan.budget == 0 {
                self.stats.count_merge(MergeReason::TokenBudget);
                break;
            }
            if self.requests[&id].status != Status::Running {
                continue; // preempted as a victim of an earlier decode
            }
            let num_computed = self.requests[&id].num_computed;
            let mut drafts = self.draft_depth(id, plan.budget, max_len);
            // Drafts never preempt anyone: without room for them the decode runs alone.
            if drafts > 0 && kv.allocate_slots(id, num_computed, 1 + drafts).is_none() {
                drafts = 0;
            }
            let mut fits = true;
            while drafts == 0 && kv.allocate_slots(id, num_computed, 1).is_none() {
                let victim = self.pick_victim(&in_step).unwrap_or(id);
                self.running.retain(|&r| r != victim);
                self.preempt(victim, kv);
                plan.preempted.push(victim);
                if victim == id {
                    fits = false;
                    break;
                }
            }
            if !fits {
                continue;
            }
            let bound = self.itl_step_bound_ms(&self.requests[&id], now);
            draft.add_decode(num_computed + 1, bound);
            draft.add_verification(drafts);
            plan.push(id, 1, drafts);
            in_step.insert(id);
        }
        draft
    }

    /// How long a step that decodes `req` at `now` may take, ms: the time left to its deadline
    /// for the next token under its mean-ITL SLO. The SLO is on the mean gap (× `itl_headroom`,
    /// `s`), so with `n` tokens out since the first at `t1`, the next one keeps the mean within
    /// it while it comes by `t1 + n·s`: a request whose steps ran faster than `s` has banked the
    /// difference and can absorb a longer step (a large prefill chunk) without missing its SLO.
    /// Never less than `s` itself, the old per-step cap: a request behind its pace (resumed
    /// after a pause, or late already) then catches up by `itl_ms − s` a token instead of
    /// holding every prefill out of the step.
    ///
    /// With an end-to-end SLO (`e2e_ms`) the step is also bounded by the request's real slack:
    /// the time left to `arrival + e2e_ms` shared evenly over the tokens it still has to
    /// produce, × `e2e_headroom` (default: the same headroom). Recomputed every step, this paces a request that is ahead
    /// looser and one that fell behind (a step that ran over its prediction) tighter, so it
    /// catches up instead of carrying the delay to its last token: a short answer of 32 tokens
    /// whose first came at 40 ms under a 780 ms SLO takes 740 / 31 × 0.9 ≈ 21.5 ms a step at
    /// first, and ends ~30 ms before its deadline rather than 10 % of it. One past its deadline
    /// keeps the ITL pace (holding prefills for it would save nothing).
    fn itl_step_bound_ms(&self, req: &Request, now: f64) -> f64 {
        let slo = self.cfg.slo.of(req.class);
        let h = self.cfg.merge.itl_headroom;
        let s = slo.itl_ms * h;
        let Some(first) = req.first_token_at else {
            return s;
        };
        let itl_bound = ((first - now) * 1e3 + req.num_output_tokens() as f64 * s).max(s);
        let tokens_left = self.expected_remaining_output(req);
        let left_ms = (req.arrival - now) * 1e3 + slo.e2e_ms;
        if tokens_left == 0 || left_ms <= 0.0 || !left_ms.is_finite() {
            return itl_bound;
        }
        let e2e_h = self.cfg.merge.e2e_headroom.unwrap_or(h);
        itl_bound.min(left_ms * e2e_h / tokens_left as f64)
    }

    /// The running request to preempt first: the longest class, then the latest admitted,
    /// among those not in the step yet.
    fn pick_victim(&self, in_step: &HashSet<RequestId>) -> Option<RequestId> {
        self.running
            .iter()
            .enumerate()
            .filter(|(_, id)| !in_step.contains(id))
            .max_by_key(|&(i, id)| (self.requests[id].class, i))
            .map(|(_, id)| *id)
    }

    /// A medium or long request that has waited `merge.promote_after` of its TTFT SLO without a
    /// first token and can still meet it (adaptive): it goes ahead of the fast lane. One that can
    /// no longer make it is not promoted: serving lost causes first would make others late too.
    fn overdue(&self, req: &Request, now: f64) -> bool {
        if req.class == RequestClass::Short || req.num_output_tokens() > 0 {
            return false;
        }
        let slo_ms = self.cfg.slo.of(req.class).ttft_ms;
        let waited_ms = (now - req.arrival) * 1e3;
        if waited_ms < self.cfg.merge.promote_after * slo_ms {
            return false;
        }
        let per_step = self.prefill_budget(req.class);
        waited_ms + self.prefill_ms(req.num_uncomputed(), per_step) <= slo_ms
    }
}

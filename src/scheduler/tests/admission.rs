//! Admission control (bounds on waiting requests and tokens, Retry-After, early rejection of
//! unreachable TTFTs) and the online cost model's fit.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::adaptive::{adaptive, coarse_cost};
use super::*;
use crate::scheduler::cost_model::{CostModel, StepFeatures};

#[test]
fn admission_bounds_waiting_requests() {
    let cfg = SchedulerConfig {
        admission: AdmissionConfig {
            max_waiting_requests: 2,
            ..AdmissionConfig::default()
        },
        ..config()
    };
    let mut s = Scheduler::new(cfg.clone());
    assert!(s.add_request(request(1), 0.0).is_accepted());
    assert_eq!(s.add_request(request(1), 0.0), Admission::Duplicate);
    assert!(s.add_request(request(2), 0.0).is_accepted());
    let Admission::Overloaded {
        reason,
        retry_after_ms,
    } = s.add_request(request(3), 0.0)
    else {
        panic!("third request accepted");
    };
    assert_eq!(reason, OverloadReason::QueueRequests);
    let a = cfg.admission;
    assert!((a.min_retry_after_ms..=a.max_retry_after_ms).contains(&retry_after_ms));
    assert_eq!(s.stats().overloaded_count(OverloadReason::QueueRequests), 1);
    let err = s.add_request(request(4), 0.0).to_error().unwrap();
    assert_eq!((err.code(), err.http_status()), ("overloaded", 429));
    assert_eq!(err.retry_after_ms(), Some(retry_after_ms));

    // Admitted requests leave the queue: room again.
    let mut kv = KvCacheManager::new(64, BLOCK_SIZE, true);
    s.schedule(&mut kv, 0.0);
    assert!(s.add_request(request(5), 0.0).is_accepted());
}

#[test]
fn admission_bounds_waiting_prompt_tokens() {
    let cfg = SchedulerConfig {
        admission: AdmissionConfig {
            max_waiting_prompt_tokens: 30,
            ..AdmissionConfig::default()
        },
        ..config()
    };
    let mut s = Scheduler::new(cfg);
    assert!(s.add_request(request(1), 0.0).is_accepted()); // 13
    assert!(s.add_request(request(2).prompt_len(17), 0.0).is_accepted()); // 30
    assert_eq!(
        s.add_request(request(3).prompt_len(1), 0.0),
        Admission::Overloaded {
            reason: OverloadReason::QueueTokens,
            retry_after_ms: AdmissionConfig::default().min_retry_after_ms,
        }
    );
}

#[test]
fn retry_after_grows_with_the_queue() {
    let cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        admission: AdmissionConfig {
            max_waiting_requests: 3,
            min_retry_after_ms: 1,
            ..AdmissionConfig::default()
        },
        ..config()
    };
    let retry = |prompt: usize| {
        let mut s = Scheduler::new(cfg.clone());
        for id in 1..=3 {
            assert!(s
                .add_request(request(id).prompt_len(prompt), 0.0)
                .is_accepted());
        }
        match s.add_request(request(4), 0.0) {
            Admission::Overloaded { retry_after_ms, .. } => retry_after_ms,
            other => panic!("{other:?}"),
        }
    };
    // 3 × 10 tokens at 1 ms plus one 5 ms step; 3 × 100 tokens in 5 steps of 64.
    assert_eq!(retry(10), 35);
    assert_eq!(retry(100), 325);
}

#[test]
fn early_reject_refuses_an_unreachable_ttft() {
    let cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        classes: ClassConfig::default(),
        admission: AdmissionConfig {
            early_reject: true,
            ..AdmissionConfig::default()
        },
        ..adaptive()
    };
    // Medium TTFT SLO 800 ms; 1 ms per token, 5 ms per 64-token step: 200 + 500 tokens take
    // 760 ms, a 200-token prompt behind those 700 would take 975 ms.
    let mut s = Scheduler::new(cfg.clone());
    assert!(s.add_request(request(1).prompt_len(200), 0.0).is_accepted());
    assert!(s.add_request(request(2).prompt_len(500), 0.0).is_accepted());
    assert!(matches!(
        s.add_request(request(3).prompt_len(200), 0.0),
        Admission::Overloaded {
            reason: OverloadReason::TtftUnreachable,
            ..
        }
    ));
    // A short request is served before the medium queue: its bound ignores it.
    assert!(s.add_request(request(4).prompt_len(5), 0.0).is_accepted());
    // FCFS never rejects early.
    let mut f = Scheduler::new(SchedulerConfig {
        policy: Policy::Fcfs,
        ..cfg
    });
    for id in 1..=3 {
        assert!(f
            .add_request(request(id).prompt_len(700), 0.0)
            .is_accepted());
    }
}

#[test]
fn early_reject_bounds_with_the_cheaper_of_fit_and_prior() {
    let cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        max_num_batched_tokens: 512,
        classes: ClassConfig {
            short_below: 8,
            long_above: 1000,
            long_prefill_budget: 64,
        },
        admission: AdmissionConfig {
            early_reject: true,
            ..AdmissionConfig::default()
        },
        ..adaptive()
    };
    let mut e = Engine::new(cfg, 256);
    // Tiny prompts whose steps take 20 ms a prompt token: fitted on these alone, the model
    // prices a prefill token 20 times the prior's 1 ms (an early fit that cannot tell the
    // step's base from its tokens).
    for id in 1..=40u64 {
        e.add(request(id).prompt_len(1 + id as usize % 7).max_tokens(2));
        let out = e.schedule();
        let mut step = e.execute(&out);
        let ms = 5.0 + 20.0 * out.num_prefill_tokens as f64 + out.num_decode_seqs as f64;
        step.elapsed = std::time::Duration::from_secs_f64(ms / 1e3);
        e.update(&out, &step);
    }
    e.run_to_completion();
    let fit = e.sched.cost_model().coefficients();
    // A 300-token medium prompt, TTFT SLO 800 ms, nothing queued: 305 ms by the prior, over
    // 800 ms by the fit. The bound takes the cheaper: admitted.
    assert!(fit.per_prefill_token_ms * 300.0 > 800.0, "{fit:?}");
    let t = e.now();
    assert!(e
        .sched
        .add_request(request(100).prompt_len(300), t)
        .is_accepted());
    // Still a bound: 900 tokens take 905 ms even by the prior.
    assert!(!e
        .sched
        .add_request(request(101).prompt_len(900), t)
        .is_accepted());
}

/// Two short requests decoding (`max_num_seqs` 2), then more added one by one until one is
/// refused: how many were accepted, and the refusal's reason. Every request is `template` (a
/// 3-token prompt, 30 output tokens, eos ignored) under its own id; `knob` changes the config
/// or the template. 5 ms a step + 1 ms per decode; short TTFT SLO 250 ms.
fn slot_wait_admissions(
    knob: impl FnOnce(&mut SchedulerConfig, &mut NewRequest),
) -> (u64, Option<OverloadReason>) {
    let mut cfg = SchedulerConfig {
        max_num_seqs: 2,
        cost_fallback: coarse_cost(),
        admission: AdmissionConfig {
            early_reject: true,
            ..AdmissionConfig::default()
        },
        ..adaptive()
    };
    cfg.slo.short.ttft_ms = 250.0;
    let mut template = request(0).prompt_len(3).max_tokens(30).ignore_eos();
    knob(&mut cfg, &mut template);
    let req = |id: u64| NewRequest {
        id: RequestId(id),
        prompt_token_ids: random_tokens(1000 + id, 3),
        ..template.clone()
    };
    let mut e = Engine::new(cfg, 256);
    e.add(req(1));
    e.add(req(2));
    e.step(); // both produced their first token: 29 to go each
    for id in 3..10 {
        match e.sched.add_request(req(id), e.now()) {
            Admission::Accepted => {}
            Admission::Overloaded { reason, .. } => return (id - 3, Some(reason)),
            Admission::Duplicate => unreachable!(),
        }
    }
    (7, None)
}

#[test]
fn early_reject_refuses_a_request_no_slot_frees_for_in_time() {
    // Slots free after 29 steps of 7 ms (203 ms): the two first waiting requests take them and
    // start within 250 ms; the third would wait for one of theirs, 59 steps (413 ms).
    assert_eq!(
        slot_wait_admissions(|_, _| {}),
        (2, Some(OverloadReason::SlotWait))
    );
    // A tighter SLO: even the first slot frees too late.
    assert_eq!(
        slot_wait_admissions(|c, _| c.slo.short.ttft_ms = 150.0),
        (0, Some(OverloadReason::SlotWait))
    );
    // Running requests that may end at any token (eos on) can free a slot next step.
    assert_eq!(
        slot_wait_admissions(|_, r| Arc::make_mut(&mut r.params).ignore_eos = false),
        (7, None)
    );
    // Spare slots: nobody waits for one.
    assert_eq!(slot_wait_admissions(|c, _| c.max_num_seqs = 16), (7, None));
    // Early rejection off.
    assert_eq!(
        slot_wait_admissions(|c, _| c.admission.early_reject = false),
        (7, None)
    );
}

fn random_features(rng: &mut ChaCha8Rng) -> StepFeatures {
    let mut f = StepFeatures::default();
    for _ in 0..rng.random_range(1..64) {
        f.add_seq(1, rng.random_range(1..4000));
    }
    for _ in 0..rng.random_range(0..3) {
        let q = rng.random_range(2..2048);
        f.add_seq(q, q + rng.random_range(0..8000));
    }
    f
}

#[test]
fn cost_model_fit_recovers_the_step_time_from_a_wrong_prior() {
    let truth = CostCoefficients::default();
    let prior = CostCoefficients {
        base_ms: 20.0,
        per_prefill_token_ms: 0.001,
        per_decode_seq_ms: 0.5,
        per_kv_token_ms: 0.0,
        per_prefill_attn_pair_ms: 1e-4,
        per_prefill_floor_pair_ms: 0.0,
    };
    let mut model = CostModel::new(prior);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..400 {
        let f = random_features(&mut rng);
        let noise = 1.0 + 0.02 * (rng.random::<f64>() - 0.5);
        model.observe(&f, truth.predict_ms(&f) * noise);
    }
    assert!(model.is_fitted());
    let c = model.coefficients();
    assert!(c.validate().is_ok(), "negative coefficient in {c:?}");
    for _ in 0..50 {
        let f = random_features(&mut rng);
        let (want, got) = (truth.predict_ms(&f), model.predict_ms(&f));
        assert!(
            (got - want).abs() <= 0.03 * want,
            "predicted {got} ms, true {want} ms"
        );
    }
}

#[test]
fn cost_model_keeps_the_prior_of_an_unexcited_feature_and_stays_non_negative() {
    let prior = CostCoefficients::default();
    let mut model = CostModel::new(prior);
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for _ in 0..200 {
        // Decodes only, and a backend whose time falls with the batch: the fit must not go
        // negative, and prefill coefficients (never seen) stay at the prior.
        let mut f = StepFeatures::default();
        let n = rng.random_range(1..100);
        for _ in 0..n {
            f.add_seq(1, 100);
        }
        model.observe(&f, 20.0 - 0.1 * n as f64 + rng.random::<f64>());
    }
    let c = model.coefficients();
    assert!(c.validate().is_ok(), "{c:?}");
    let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
    assert!(
        same(c.per_prefill_token_ms, prior.per_prefill_token_ms),
        "{c:?}"
    );
    assert!(
        same(c.per_prefill_attn_pair_ms, prior.per_prefill_attn_pair_ms),
        "{c:?}"
    );
    assert_eq!(c.per_decode_seq_ms, 0.0);
}

use std::sync::Arc;

use super::*;
use crate::request::RequestId;
use crate::sampling::params::SamplingParams;

/// A batch of `seqs` (id, known token, drafts), each one decode with drafts, sampling with
/// `params`.
fn batch(seqs: &[(u64, u32, &[u32])], params: &Arc<SamplingParams>) -> BatchInput {
    let mut b = BatchInput::default();
    for (i, &(id, known, drafts)) in seqs.iter().enumerate() {
        let mut tokens = vec![known];
        tokens.extend_from_slice(drafts);
        b.push_seq(
            RequestId(id),
            &tokens,
            10 * i,
            &[i as u32, 100 + i as u32],
            16,
            Some(SampleInput {
                params: params.clone(),
                seed: 7,
                output_index: 3,
            }),
        );
        b.seqs.last_mut().unwrap().num_drafts = drafts.len();
    }
    b
}

fn rows(ids: &[(u64, u32)]) -> Vec<SampledToken> {
    ids.iter()
        .map(|&(id, token)| SampledToken {
            request_id: RequestId(id),
            token,
            logprob: -(token as f32),
        })
        .collect()
}

fn point_drafts(ids: &[(u64, &[u32])]) -> StepDrafts {
    let mut d = StepDrafts::default();
    for &(id, tokens) in ids {
        d.ids.push(RequestId(id));
        d.proposals.push(Proposal {
            tokens: tokens.to_vec(),
            probs: Vec::new(),
        });
    }
    d
}

#[test]
fn device_draws_keep_the_draws_while_they_equal_the_drafts() {
    let params = Arc::new(SamplingParams::default());
    // Request 1: drafts [5, 6, 7], draws [5, 6, 9, 4] → 2 accepted, then the draw 9.
    // Request 2: no draft positions, one draw.
    // Request 3: drafts [8], draws [8, 3] → all accepted, then the bonus 3.
    // Request 4: draft positions but an empty proposal → its one draw, 0 of 0 accepted.
    let b = batch(
        &[(1, 1, &[5, 6, 7]), (2, 2, &[]), (3, 3, &[8]), (4, 4, &[])],
        &params,
    );
    let r = rows(&[
        (1, 5),
        (1, 6),
        (1, 9),
        (1, 4),
        (2, 11),
        (3, 8),
        (3, 3),
        (4, 12),
    ]);
    assert_eq!(r.len(), b.num_logit_rows());
    let drafts = point_drafts(&[(1, &[5, 6, 7]), (3, &[8]), (4, &[])]);
    let draws = DeviceDraws {
        batch: &b,
        rows: &r,
        drafts: &drafts,
    };
    assert!(draws.dense_rows().is_empty());
    let mut out = StepOutput::default();
    let none = Logits {
        data: &[],
        vocab: 16,
        sample_vocab: 16,
    };
    draws.verify(&mut HostSampler::new(), none, &mut out);
    let got: Vec<(u64, u32)> = out
        .sampled
        .iter()
        .map(|s| (s.request_id.0, s.token))
        .collect();
    assert_eq!(
        got,
        vec![(1, 5), (1, 6), (1, 9), (2, 11), (3, 8), (3, 3), (4, 12)]
    );
    let outcomes: Vec<(u64, usize, usize)> = out
        .spec
        .drafts
        .iter()
        .map(|d| (d.request_id.0, d.proposed, d.accepted))
        .collect();
    assert_eq!(outcomes, vec![(1, 3, 2), (3, 1, 1), (4, 0, 0)]);
    // The log-probabilities are the draws' own.
    assert_eq!(out.sampled[2].logprob, -9.0);
}

#[test]
fn dense_proposals_are_verified_on_the_host_from_their_rows() {
    // Sampled request 1 with a dense proposal over a vocabulary of 4, then a plain request 2.
    let params = Arc::new(SamplingParams {
        temperature: 0.8,
        ..SamplingParams::default()
    });
    let b = batch(&[(1, 1, &[2, 3]), (2, 2, &[])], &params);
    let mut drafts = StepDrafts::default();
    drafts.ids.push(RequestId(1));
    let q = [0.1, 0.2, 0.6, 0.1, 0.25, 0.25, 0.25, 0.25];
    drafts.proposals.push(Proposal {
        tokens: vec![2, 3],
        probs: q.to_vec(),
    });
    let r = rows(&[(1, 0), (1, 0), (1, 0), (2, 1)]);
    let draws = DeviceDraws {
        batch: &b,
        rows: &r,
        drafts: &drafts,
    };
    assert_eq!(draws.dense_rows(), vec![(0, 3)]);
    let logits: Vec<f32> = (0..12).map(|i| (i % 5) as f32 * 0.7).collect();
    let dense = Logits {
        data: &logits,
        vocab: 4,
        sample_vocab: 4,
    };
    let mut out = StepOutput::default();
    draws.verify(&mut HostSampler::new(), dense, &mut out);
    // The same as the host sampler verifying that sequence alone from the same rows.
    let mut want = StepOutput::default();
    HostSampler::new().sample_seq(
        SeqSample {
            seq: &b.seqs[0],
            sample: b.seqs[0].sample.as_ref().unwrap(),
            logits: dense,
            drafts: &[2, 3],
            proposal: Some(&drafts.proposals[0]),
            counts: None,
        },
        &mut want,
    );
    let n = want.sampled.len();
    assert_eq!(out.sampled[..n], want.sampled[..]);
    assert_eq!(out.spec.drafts, want.spec.drafts);
    // Then request 2's own draw.
    assert_eq!(out.sampled[n..], rows(&[(2, 1)])[..]);
}

#[test]
fn forced_acceptance_keeps_drafts_at_the_set_rate() {
    let params = Arc::new(SamplingParams::greedy(64));
    let b = batch(&[(1, 1, &[5, 6, 7]), (2, 2, &[])], &params);
    // The target's draws never equal the drafts: only the forced rule accepts anything.
    let r = rows(&[(1, 15), (1, 14), (1, 13), (1, 12), (2, 11)]);
    let drafts = point_drafts(&[(1, &[5, 6, 7])]);
    let draws = DeviceDraws {
        batch: &b,
        rows: &r,
        drafts: &drafts,
    };
    let run = |rate: f64| {
        let mut f = ForcedAcceptance::new(rate, 3).unwrap();
        let mut out = StepOutput::default();
        draws.verify_forced(&mut f, &mut out);
        let got: Vec<(u64, u32)> = out
            .sampled
            .iter()
            .map(|s| (s.request_id.0, s.token))
            .collect();
        (got, out.spec.drafts[0].accepted)
    };
    // All accepted: the drafts, then the target's bonus draw; the plain request untouched.
    assert_eq!(
        run(1.0),
        (vec![(1, 5), (1, 6), (1, 7), (1, 12), (2, 11)], 3)
    );
    // None accepted: the target's own draw at the first position.
    assert_eq!(run(0.0), (vec![(1, 15), (2, 11)], 0));
    assert!(ForcedAcceptance::new(1.5, 0).is_err());
    // Per-draft rate a over many verifications of depth 3: accepted / proposed is near
    // E[accepted] / 3 = (a + a^2 + a^3) / 3.
    for a in [0.5f64, 0.8] {
        let mut f = ForcedAcceptance::new(a, 9).unwrap();
        let n = 20_000;
        let total: usize = (0..n).map(|_| f.accepted(3)).sum();
        let want = (a + a * a + a * a * a) / 3.0;
        let got = total as f64 / (3 * n) as f64;
        assert!((got - want).abs() < 0.01, "a {a}: {got} vs {want}");
    }
}

//! The packed metadata read back the way the kernels read it (rows, per-row tables, the device
//! block tables after the step's updates), for steps built by the persistent input batch: rows
//! not all in the step, rows moved by a drop, GEMM and flash prefill, graph padding. CPU only.

use std::sync::Arc;

use super::*;
use crate::executor::cuda::kernels::DECODE_CLUSTER_MAX;
use crate::executor::cuda::options::DecodeKernel;
use crate::executor::cuda::prefill_gemm::scratch_capacity;
use crate::executor::input_batch::InputBatch;
use crate::request::RequestId;
use crate::sampling::params::SamplingParams;
use crate::step::{SampleInput, SampledToken, ScheduledRequest, SchedulerOutput, StepOutput};

const BS: usize = 16;
const NUM_BLOCKS: usize = 64;

pub(super) fn limits() -> Limits {
    let (gemm_keys, gemm_scores) = scratch_capacity(64, 256, 8, 4);
    Limits {
        max_tokens: 256,
        max_seqs: 8,
        max_rows: 8,
        max_blocks: 12,
        num_sms: 132,
        num_heads: 4,
        decode: DecodeSplitRule {
            num_sms: 132,
            num_heads: 4,
            num_kv_heads: 2,
            ctas_per_sm: 0,
            kernel: DecodeKernel::Lanes,
            min_keys: 0,
            cluster_wave: 0,
            item_ctas: 0,
        },
        prefill_split_kv: true,
        gemm_max_len: 64,
        gemm_keys,
        gemm_scores,
        max_edits: 64,
    }
}

fn new_req(id: u64, prompt: usize, n: usize, blocks: Vec<u32>) -> ScheduledRequest {
    let tokens = (0..prompt as u32).map(|t| t + 100 * id as u32).collect();
    let params = Arc::new(SamplingParams::greedy(4));
    ScheduledRequest::first(id, tokens, n, blocks, params, id)
}

fn cached(id: u64, computed: usize, n: usize, sample: bool, blocks: Vec<u32>) -> ScheduledRequest {
    ScheduledRequest::running(id, computed, n, sample, blocks)
}

/// The emulated device: block tables (max_seqs + 1 rows, zeroed at start) and what a step's
/// kernels would read.
struct Device {
    table: Vec<u32>,
}

impl Device {
    fn new(lim: &Limits) -> Self {
        Device {
            table: vec![0; (lim.max_seqs + 1) * lim.max_blocks],
        }
    }

    /// `block_table_update`, from the packed metadata.
    fn apply_updates(&mut self, step: &Step, meta: &[u32]) {
        let l = &step.layout;
        for k in 0..step.nu {
            self.table[meta[l.table_index + k] as usize] = meta[l.table_value + k];
        }
    }

    /// What the kernels of one step read, checked against the batch.
    fn check_reads(&self, lim: &Limits, step: &Step, host: &HostMeta, b: &BatchInput) {
        let (l, m) = (&step.layout, &host.meta);
        let n = b.num_tokens();
        assert_eq!(&m[l.tokens..l.tokens + n], &b.token_ids[..]);
        assert_eq!(&m[l.positions..l.positions + n], &b.positions[..]);
        assert_eq!(&m[l.slots..l.slots + n], &b.slot_mapping[..]);
        let table = |row: usize, ctx: usize| -> Vec<u32> {
            self.table[row * lim.max_blocks..][..ctx.div_ceil(BS)].to_vec()
        };
        // Every sequence is read through its row: its context, first query row, length and
        // block table, by whichever kernel serves it.
        let mut start = 0;
        let mut seen = 0;
        for q in &b.seqs {
            let r = q.row;
            assert_eq!(m[l.ctx + r] as usize, q.context_len, "{}", q.request_id);
            assert_eq!(m[l.q_start + r] as usize, start);
            assert_eq!(m[l.q_len + r] as usize, q.query_len);
            assert_eq!(
                table(r, q.context_len),
                b.block_table(q)[..q.context_len.div_ceil(BS)]
            );
            let served = if q.query_len == 1 {
                (0..step.nd)
                    .any(|k| m[l.dec_seq + k] as usize == r && m[l.dec_row + k] as usize == start)
            } else {
                let tiles = (0..step.nt)
                    .filter(|&k| m[l.tile_seq + k] as usize == r)
                    .count();
                let gemm = host
                    .gemm
                    .iter()
                    .filter(|g| g.seq == r && g.q_start == start)
                    .count();
                let gemm_meta = (0..host.gemm.len())
                    .filter(|&k| m[l.gemm_seq + k] as usize == r)
                    .count();
                assert_eq!(gemm, gemm_meta);
                (tiles == q.query_len.div_ceil(PREFILL_TILE) && gemm == 0)
                    || (tiles == 0 && gemm == 1)
            };
            assert!(served, "{} is served exactly once", q.request_id);
            start += q.query_len;
            seen += 1;
        }
        assert_eq!(seen, b.seqs.len());
        // Sampled rows: each sampling sequence's last token, in order, then the padding.
        let want: Vec<u32> = b
            .seqs
            .iter()
            .scan(0, |end, q| {
                *end += q.query_len;
                Some((q.sample.is_some(), *end as u32 - 1))
            })
            .filter_map(|(s, row)| s.then_some(row))
            .collect();
        assert_eq!(&m[l.sample_rows..l.sample_rows + want.len()], &want[..]);
        assert_eq!(host.args.len(), step.ns);
        // The sampling arguments, as the sample kernel reads them.
        for (k, a) in host.args.iter().enumerate() {
            let w = &m[l.args + k * ARG_WORDS..l.args + (k + 1) * ARG_WORDS];
            assert_eq!(w[0] as u64 | (w[1] as u64) << 32, a.seed);
            assert_eq!(w[2] as u64 | (w[3] as u64) << 32, a.output_index);
            assert_eq!(f32::from_bits(w[4]), a.temperature);
            assert_eq!(f32::from_bits(w[5]), a.top_p);
            assert_eq!(f32::from_bits(w[6]), a.min_p);
            assert_eq!(w[7] as i32, a.top_k);
            assert_eq!(f32::from_bits(w[8]), a.presence);
            assert_eq!(f32::from_bits(w[9]), a.frequency);
            assert_eq!(f32::from_bits(w[10]), a.repetition);
            assert_eq!(w[11] as i32, a.counts_row);
            assert_eq!(w[12] as i32, a.edit_start);
            assert_eq!(w[13] as i32, a.num_edits);
            assert_eq!(w[14] as i32, a.num_logprobs);
        }
        // The logit edits, each row's from its `edit_start`.
        for (k, e) in host.edits.iter().enumerate() {
            let w = &m[l.edits + k * EDIT_WORDS..l.edits + (k + 1) * EDIT_WORDS];
            assert_eq!((w[0] as i32, f32::from_bits(w[1])), (e.token, e.value));
        }
        assert_eq!(l.table_index, l.edits + host.edits.len() * EDIT_WORDS);
    }
}

/// Applies `out` to the input batch and packs it the way the backend does; checks the reads.
fn run(
    ib: &mut InputBatch,
    dev: &mut Device,
    out: &SchedulerOutput,
    graphs: bool,
) -> (Step, Option<usize>) {
    let lim = limits();
    ib.update(out).unwrap();
    let mut updates = Vec::new();
    ib.drain_table_changes(|r, c, id| updates.push(((r * lim.max_blocks + c) as u32, id)));
    let b = ib.batch();
    let bucket = graph_bucket(b, graphs, lim.max_seqs);
    let mut host = HostMeta::default();
    let shape = bucket.map(|bucket| GraphShape { bucket, drafts: 0 });
    assert_eq!(
        shape,
        graph_shape(b, &lim, graphs, true),
        "decode graphs unchanged"
    );
    let step = pack(&lim, b, shape, &updates, true, &mut host).unwrap();
    dev.apply_updates(&step, &host.meta);
    dev.check_reads(&lim, &step, &host, b);
    if let Some(bk) = bucket {
        let l = &step.layout;
        // The layout is the bucket's, whatever the real batch and the updates; the per-row
        // tables span every row up to the spare one.
        let (w, spare) = (lim.max_seqs + 1, lim.max_seqs);
        assert_eq!(
            *l,
            Layout::new(bk, w, bk, 0, 0, bk, host.edits.len(), step.nu)
        );
        // What the graph reads does not move with the edits' or the updates' count.
        let bare = Layout::new(bk, w, bk, 0, 0, bk, 0, 0);
        assert_eq!((l.args, l.edits), (bare.args, bare.edits));
        // Padding reads the spare row (never a request's, so block 0 throughout), not row `bk`,
        // which may be a live request outside the step.
        for k in b.seqs.len()..bk {
            assert_eq!(host.meta[l.dec_seq + k] as usize, spare);
            let tok = host.meta[l.dec_row + k] as usize;
            assert_eq!(host.meta[l.slots + tok], u32::MAX);
        }
        assert_eq!(
            (host.meta[l.ctx + spare], host.meta[l.q_len + spare]),
            (1, 1)
        );
        assert_eq!(dev.table[spare * lim.max_blocks], 0);
    }
    let sampled = b
        .seqs
        .iter()
        .filter(|q| q.sample.is_some())
        .map(|q| SampledToken {
            request_id: q.request_id,
            token: 7,
            logprob: 0.0,
        })
        .collect();
    ib.record(&StepOutput {
        sampled,
        elapsed: std::time::Duration::ZERO,
        ..StepOutput::default()
    })
    .unwrap();
    (step, bucket)
}

fn step(scheduled: Vec<ScheduledRequest>, finished: &[u64]) -> SchedulerOutput {
    SchedulerOutput {
        scheduled,
        finished_req_ids: finished.iter().map(|&i| RequestId(i)).collect(),
        ..SchedulerOutput::default()
    }
}

#[test]
fn kernels_read_every_sequence_through_its_row_across_steps() {
    let lim = limits();
    let mut ib = InputBatch::new(BS, NUM_BLOCKS, lim.max_blocks).track_table_changes();
    let mut dev = Device::new(&lim);
    // A 40-token chunk (GEMM path), a whole 5-token prompt, a 1-token prompt (a decode item),
    // a 100-token prompt (flash tiles).
    let (s, _) = run(
        &mut ib,
        &mut dev,
        &step(
            vec![
                new_req(1, 70, 40, vec![3, 9, 4]),
                new_req(2, 5, 5, vec![11]),
                new_req(3, 1, 1, vec![20]),
                new_req(4, 100, 100, vec![30, 31, 32, 33, 34, 35, 36]),
            ],
            &[],
        ),
        true,
    );
    assert_eq!((s.nd, s.nt), (1, 2));
    // Request 2 finished: request 4 moves into its row; 1 finishes its prompt; 3 decodes.
    let (s, _) = run(
        &mut ib,
        &mut dev,
        &step(
            vec![
                cached(3, 1, 1, true, vec![]),
                cached(1, 40, 30, true, vec![5, 6]),
                cached(4, 100, 1, true, vec![]),
            ],
            &[2],
        ),
        true,
    );
    assert_eq!(s.nd, 2);
    // Pure decode, rows 0..3 all in: a graph step padded to bucket 4.
    let (_, bucket) = run(
        &mut ib,
        &mut dev,
        &step(
            vec![
                cached(1, 70, 1, true, vec![]),
                cached(3, 2, 1, true, vec![]),
                cached(4, 101, 1, true, vec![]),
            ],
            &[],
        ),
        true,
    );
    assert_eq!(bucket, Some(4));
    // Only request 3, in row 2: the bucket covers the rows read, not just the sequences.
    let (_, bucket) = run(
        &mut ib,
        &mut dev,
        &step(vec![cached(3, 3, 1, true, vec![])], &[]),
        true,
    );
    assert_eq!(bucket, Some(4));
    // Request 1 finished (request 3 moves into row 0). Without graphs the per-row tables are
    // as wide as the rows read: request 4 is in row 1.
    let (s, bucket) = run(
        &mut ib,
        &mut dev,
        &step(vec![cached(4, 102, 1, true, vec![])], &[1]),
        false,
    );
    assert_eq!((bucket, s.layout.q_start - s.layout.ctx), (None, 2));
}

#[test]
fn graph_buckets_cover_sequences_and_rows() {
    let mut b = BatchInput::default();
    let greedy = || {
        Some(crate::step::SampleInput {
            params: Arc::new(SamplingParams::greedy(1)),
            seed: 0,
            output_index: 0,
        })
    };
    b.push_seq(RequestId(1), &[1], 3, &[0], BS, greedy());
    assert_eq!(graph_bucket(&b, true, 8), Some(1));
    b.seqs[0].row = 5;
    assert_eq!(graph_bucket(&b, true, 8), Some(8));
    assert_eq!(graph_bucket(&b, true, 4), None);
    assert_eq!(graph_bucket(&b, false, 8), None);
    b.seqs[0].row = 0;
    b.push_seq(RequestId(2), &[1, 2], 0, &[1], BS, greedy());
    assert_eq!(
        graph_bucket(&b, true, 8),
        None,
        "a prefill runs without a graph"
    );
}

#[test]
fn layout_sections_are_disjoint_and_depend_on_counts_only() {
    let l = Layout::new(10, 3, 2, 1, 2, 3, 5, 4);
    assert_eq!(l.tokens, 0);
    assert_eq!(l.positions, 10);
    assert_eq!(l.ctx, 30);
    assert_eq!(l.gemm_seq, 30 + 9 + 4 + 2);
    assert_eq!(l.sample_rows, 30 + 9 + 4 + 2 + 6);
    // 51 + 3 = 54 words: the arguments start on that even word, ARG_WORDS each.
    assert_eq!(l.args, l.sample_rows + 3);
    assert_eq!(l.args % 2, 0);
    assert_eq!(ARG_WORDS, 16);
    assert_eq!(l.edits, l.args + 3 * ARG_WORDS);
    assert_eq!(l.table_index, l.edits + 5 * EDIT_WORDS);
    assert_eq!(l.total, l.table_index + 8);
    assert_eq!(
        Layout::new(10, 3, 2, 1, 2, 2, 5, 4).args % 2,
        0,
        "odd offset padded"
    );
    assert_eq!(Layout::new(10, 3, 2, 1, 2, 3, 5, 4), l);
    // Edits and updates come last: a decode graph's sections do not move with their counts.
    let (a, b) = (
        Layout::new(4, 5, 4, 0, 0, 4, 0, 0),
        Layout::new(4, 5, 4, 0, 0, 4, 7, 9),
    );
    assert_eq!(
        (a.sample_rows, a.args, a.edits),
        (b.sample_rows, b.args, b.edits)
    );
    assert_eq!(b.table_index, a.table_index + 7 * EDIT_WORDS);
}

#[test]
fn oversized_steps_are_refused() {
    let lim = limits();
    let mut host = HostMeta::default();
    let mut b = BatchInput::default();
    b.push_seq(RequestId(1), &[1], 0, &[0], BS, None);
    b.seqs[0].row = 8;
    let e = pack(&lim, &b, None, &[], true, &mut host)
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 8"), "{e}");
    let mut b = BatchInput::default();
    b.push_seq(RequestId(1), &[1], 0, &[0; 13], BS, None);
    let e = pack(&lim, &b, None, &[], true, &mut host)
        .unwrap_err()
        .to_string();
    assert!(e.contains("13 blocks"), "{e}");
}

fn sampled_with(params: SamplingParams, output_index: usize) -> Option<SampleInput> {
    Some(SampleInput {
        params: Arc::new(params),
        seed: 9,
        output_index,
    })
}

#[test]
fn logit_edits_merge_bias_and_the_min_tokens_mask() {
    let p = SamplingParams {
        logit_bias: vec![(2, 1.5), (5, -3.0), (9, 4.0)],
        min_tokens: 3,
        min_tokens_blocked: vec![1, 5, 11],
        ..Default::default()
    };
    let edits = |index| {
        let mut out = Vec::new();
        logit_edits(&p, index, &mut out);
        out.into_iter()
            .map(|e| (e.token, e.value))
            .collect::<Vec<_>>()
    };
    let inf = f32::NEG_INFINITY;
    // Before min_tokens: one entry per id, a masked id stays masked whatever its bias.
    assert_eq!(
        edits(2),
        vec![(1, inf), (2, 1.5), (5, inf), (9, 4.0), (11, inf)]
    );
    assert_eq!(edits(3), vec![(2, 1.5), (5, -3.0), (9, 4.0)]);
}

#[test]
fn sample_args_carry_penalties_edits_and_logprobs() {
    let lim = limits();
    let mut host = HostMeta::default();
    let mut b = BatchInput::default();
    let pen = SamplingParams {
        frequency_penalty: 0.5,
        repetition_penalty: 1.2,
        logit_bias: vec![(4, 2.0)],
        logprobs: Some(30),
        ..Default::default()
    };
    b.push_seq(
        RequestId(1),
        &[1],
        0,
        &[0],
        BS,
        sampled_with(SamplingParams::default(), 0),
    );
    b.push_seq(
        RequestId(2),
        &[1],
        0,
        &[1],
        BS,
        sampled_with(pen.clone(), 0),
    );
    pack(&lim, &b, None, &[], true, &mut host).unwrap();
    let a = &host.args;
    assert_eq!(
        (a[0].counts_row, a[0].num_edits, a[0].num_logprobs),
        (-1, 0, 0)
    );
    assert_eq!(
        (a[1].counts_row, a[1].edit_start, a[1].num_edits),
        (1, 0, 1)
    );
    assert_eq!((a[1].frequency, a[1].repetition), (0.5, 1.2));
    assert_eq!(a[1].num_logprobs, SAMPLE_MAX_TOP as i32);
    assert_eq!(
        host.edits,
        vec![SampleEdit {
            token: 4,
            value: 2.0
        }]
    );
    // A hand-built batch has no device counts: penalties are refused, not ignored.
    let e = pack(&lim, &b, None, &[], false, &mut host).unwrap_err();
    assert!(e.to_string().contains("penalties"), "{e}");
    // More edits than the buffer holds.
    let big = SamplingParams {
        logit_bias: (0..65).map(|t| (t, 1.0)).collect(),
        ..Default::default()
    };
    let mut b = BatchInput::default();
    b.push_seq(RequestId(3), &[1], 0, &[0], BS, sampled_with(big, 0));
    let e = pack(&lim, &b, None, &[], true, &mut host).unwrap_err();
    assert!(e.to_string().contains("logit edits"), "{e}");
}

/// A graph step whose rows have logit edits and which carries table updates: the arguments and
/// edits sit where the bucket's graph reads them, the updates after the edits.
#[test]
fn edits_sit_between_the_arguments_and_the_table_updates() {
    let lim = limits();
    let mut host = HostMeta::default();
    let mut b = BatchInput::default();
    let biased = SamplingParams {
        logit_bias: vec![(3, 0.5), (8, -1.0)],
        min_tokens: 2,
        min_tokens_blocked: vec![2],
        presence_penalty: 0.25,
        ..Default::default()
    };
    b.push_seq(RequestId(1), &[5], 3, &[0], BS, sampled_with(biased, 1));
    b.push_seq(
        RequestId(2),
        &[6],
        7,
        &[1],
        BS,
        sampled_with(SamplingParams::default(), 4),
    );
    let updates = [(3, 40), (17, 41)];
    let bucket = graph_bucket(&b, true, lim.max_seqs);
    assert_eq!(bucket, Some(2));
    let shape = bucket.map(|bucket| GraphShape { bucket, drafts: 0 });
    let step = pack(&lim, &b, shape, &updates, true, &mut host).unwrap();
    let (l, m) = (&step.layout, &host.meta);
    let bare = Layout::new(2, lim.max_seqs + 1, 2, 0, 0, 2, 0, 0);
    assert_eq!((l.args, l.edits), (bare.args, bare.edits));
    // Row 0: the mask of id 2 and the two biases, in id order; row 1 none.
    let edits: Vec<(i32, f32)> = (0..3)
        .map(|k| {
            (
                m[l.edits + 2 * k] as i32,
                f32::from_bits(m[l.edits + 2 * k + 1]),
            )
        })
        .collect();
    assert_eq!(edits, vec![(2, f32::NEG_INFINITY), (3, 0.5), (8, -1.0)]);
    let args = |k: usize| &m[l.args + k * ARG_WORDS..l.args + (k + 1) * ARG_WORDS];
    // Row 0 counts in its row 0, edits 0..3; row 1 none.
    assert_eq!((args(0)[11], args(0)[12], args(0)[13]), (0, 0, 3));
    assert_eq!(f32::from_bits(args(0)[8]), 0.25);
    assert_eq!((args(1)[11] as i32, args(1)[13]), (-1, 0));
    assert_eq!(l.table_index, l.edits + 3 * EDIT_WORDS);
    assert_eq!(&m[l.table_index..l.table_index + 2], &[3, 17]);
    assert_eq!(&m[l.table_value..l.table_value + 2], &[40, 41]);
    assert_eq!(m.len(), l.total);
}

/// A verification (speculative decoding): a sequence with k drafts samples its last k + 1 rows,
/// each at its own output index; it is never a graph step; too many rows are refused.
#[test]
fn a_sequence_with_drafts_samples_its_last_k_plus_1_rows() {
    let lim = Limits {
        max_rows: 5,
        ..limits()
    };
    let mut host = HostMeta::default();
    let mut b = BatchInput::default();
    b.push_seq(
        RequestId(1),
        &[1],
        4,
        &[0],
        BS,
        sampled_with(SamplingParams::default(), 2),
    );
    // Known token 7 at position 9, drafts 8 and 9 after it.
    b.push_seq(
        RequestId(2),
        &[7, 8, 9],
        9,
        &[1],
        BS,
        sampled_with(SamplingParams::default(), 5),
    );
    b.seqs[1].num_drafts = 2;
    assert_eq!(b.num_logit_rows(), 4);
    assert_eq!(graph_bucket(&b, true, lim.max_seqs), None);
    let step = pack(&lim, &b, None, &[], true, &mut host).unwrap();
    let (l, m) = (&step.layout, &host.meta);
    assert_eq!(step.ns, 4);
    assert_eq!(&m[l.sample_rows..l.sample_rows + 4], &[0, 1, 2, 3]);
    let index = |k: usize| m[l.args + k * ARG_WORDS + 2];
    assert_eq!((0..4).map(index).collect::<Vec<_>>(), vec![2, 5, 6, 7]);
    // Penalties never come with drafts.
    let mut pen = b.clone();
    pen.seqs[1].sample = sampled_with(
        SamplingParams {
            presence_penalty: 0.5,
            ..Default::default()
        },
        5,
    );
    let e = pack(&lim, &pen, None, &[], true, &mut host).unwrap_err();
    assert!(
        e.to_string()
            .contains("drafts for a request with penalties"),
        "{e}"
    );
    // More rows than the sampler's buffers hold.
    b.push_seq(
        RequestId(3),
        &[3, 4],
        2,
        &[2],
        BS,
        sampled_with(SamplingParams::default(), 0),
    );
    b.seqs[2].num_drafts = 1;
    let e = pack(&lim, &b, None, &[], true, &mut host).unwrap_err();
    assert!(e.to_string().contains("samples 6 rows"), "{e}");
}

/// Decode splits merge in a thread-block cluster, capped at the largest cluster, only where the
/// capped grid fills at most half a wave of the kernel; else the rule is the same as without.
#[test]
fn cluster_merged_decode_splits_are_capped_and_fill_half_a_wave() {
    // Llama-2-7B's 32 heads on the lane kernel, 8 CTAs an SM of 132.
    let filled = DecodeSplitRule {
        num_heads: 32,
        num_kv_heads: 32,
        ctas_per_sm: 8,
        ..limits().decode
    };
    let cluster = DecodeSplitRule {
        cluster_wave: 8 * 132,
        item_ctas: 32,
        ..filled
    };
    assert_eq!(filled.splits(1, 4096), (32, false));
    // 32 x 16 = 512 CTAs, under half of 1,056.
    assert_eq!(cluster.splits(1, 4096), (DECODE_CLUSTER_MAX, true));
    assert_eq!(cluster.splits(1, 128), (4, true));
    // Two items at 16 splits, four at 8: 1,024 CTAs, a full wave.
    assert_eq!(cluster.splits(2, 4096), (16, false));
    assert_eq!(cluster.splits(4, 4096), (8, false));
    // Short contexts leave room: 2 x 32 x 4 = 256 CTAs.
    assert_eq!(cluster.splits(2, 128), (4, true));
    // One split: nothing to merge.
    assert_eq!(cluster.splits(64, 4096), (1, false));
    // Llama-3-8B on the tensor-core kernel (2 resident an SM, fill 4, 128 keys a split): batch 1
    // at 4k takes 16 in a cluster instead of 32 (128 CTAs of 264); batch 2 (256) and 4 (512) do
    // not.
    let gqa = DecodeSplitRule {
        num_kv_heads: 8,
        ctas_per_sm: 4,
        kernel: DecodeKernel::Mma,
        cluster_wave: 2 * 132,
        item_ctas: 8,
        ..filled
    };
    assert_eq!(gqa.splits(1, 4000), (16, true));
    assert_eq!(gqa.splits(2, 4000), (32, false));
    assert_eq!(gqa.splits(4, 4000), (16, false));
    assert_eq!(gqa.splits(16, 4000), (4, false));
    let no_cluster = DecodeSplitRule {
        cluster_wave: 0,
        ..gqa
    };
    assert_eq!(no_cluster.splits(1, 4000), (32, false));
    // Limits applies its rule.
    let lim = Limits {
        decode: gqa,
        ..limits()
    };
    assert_eq!(lim.decode_splits(1, 4000), (16, true));
}

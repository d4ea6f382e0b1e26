//! Verification graphs (`CudaBackendOptions::verify_graphs`): which steps get one, and the
//! padded metadata read back the way the kernels read it: a layout that is the shape's alone,
//! real rows exactly as the eager packing puts them, padding that writes no K/V and whose
//! sampled rows are rows some flash tile attends. CPU only.

use std::sync::Arc;

use super::*;
use crate::request::RequestId;
use crate::sampling::params::SamplingParams;
use crate::step::SampleInput;

const BS: usize = 16;

fn limits() -> Limits {
    // The decode tests' limits, with rows for k + 1 = 4 per sequence and no GEMM path.
    Limits {
        max_rows: 8 * 4,
        gemm_max_len: 0,
        gemm_keys: 0,
        gemm_scores: 0,
        ..super::tests::limits()
    }
}

fn sampled(seed: u64, output_index: usize) -> Option<SampleInput> {
    Some(SampleInput {
        params: Arc::new(SamplingParams {
            temperature: 0.7,
            ..SamplingParams::default()
        }),
        seed,
        output_index,
    })
}

/// A verification of `k` drafts in `row`: the last accepted token then the drafts, from
/// position `pos`, in blocks `first_block..`.
fn verify(b: &mut BatchInput, id: u64, row: usize, k: usize, pos: usize, first_block: u32) {
    let tokens: Vec<u32> = (0..=k as u32).map(|t| 100 * id as u32 + t).collect();
    let blocks: Vec<u32> = (0..(pos + k + 1).div_ceil(BS) as u32)
        .map(|i| first_block + i)
        .collect();
    b.push_seq(RequestId(id), &tokens, pos, &blocks, BS, sampled(id, 3));
    let q = b.seqs.last_mut().expect("pushed");
    q.num_drafts = k;
    q.row = row;
}

fn shape(bucket: usize, drafts: usize) -> Option<GraphShape> {
    Some(GraphShape { bucket, drafts })
}

#[test]
fn only_uniform_verifications_within_the_budgets_get_a_verify_graph() {
    let lim = limits();
    let mut b = BatchInput::default();
    verify(&mut b, 1, 0, 2, 20, 0);
    assert_eq!(graph_shape(&b, &lim, true, true), shape(1, 2));
    assert_eq!(graph_shape(&b, &lim, true, false), None, "opt-in");
    assert_eq!(graph_shape(&b, &lim, false, true), None, "graphs off");
    // The bucket covers the rows read, as a decode graph's.
    b.seqs[0].row = 2;
    assert_eq!(graph_shape(&b, &lim, true, true), shape(4, 2));
    verify(&mut b, 2, 0, 2, 40, 10);
    assert_eq!(graph_shape(&b, &lim, true, true), shape(4, 2));
    // Padded past the token or row budget: eager.
    let tight = Limits {
        max_rows: 11,
        ..lim
    };
    assert_eq!(graph_shape(&b, &tight, true, true), None);
    let tight = Limits {
        max_tokens: 11,
        ..lim
    };
    assert_eq!(graph_shape(&b, &tight, true, true), None);
    // Mixed draft counts, a decode beside a verification, a row that does not sample, a
    // prefill chunk: eager.
    let mut mixed = b.clone();
    verify(&mut mixed, 3, 1, 1, 7, 20);
    assert_eq!(graph_shape(&mixed, &lim, true, true), None);
    let mut with_decode = b.clone();
    with_decode.push_seq(RequestId(4), &[9], 5, &[30], BS, sampled(4, 0));
    with_decode.seqs[2].row = 1;
    assert_eq!(graph_shape(&with_decode, &lim, true, true), None);
    let mut silent = b.clone();
    silent.seqs[1].sample = None;
    assert_eq!(graph_shape(&silent, &lim, true, true), None);
    let mut prefill = b.clone();
    prefill.seqs[1].num_drafts = 0;
    assert_eq!(graph_shape(&prefill, &lim, true, true), None);
    // More queries than one flash tile holds.
    let mut long = BatchInput::default();
    verify(&mut long, 1, 0, PREFILL_TILE, 3, 0);
    let roomy = Limits {
        max_rows: 8 * 80,
        ..lim
    };
    assert_eq!(graph_shape(&long, &roomy, true, true), None);
    // Pure decode keeps its decode graph with verify graphs on.
    let mut dec = BatchInput::default();
    dec.push_seq(RequestId(1), &[5], 3, &[0], BS, sampled(1, 0));
    assert_eq!(graph_shape(&dec, &lim, true, true), shape(1, 0));
    assert_eq!(graph_shape(&dec, &lim, true, false), shape(1, 0));
}

/// Packs `b` under `g` and checks what the kernels of the graph read; returns the step.
fn pack_checked(lim: &Limits, b: &BatchInput, g: GraphShape) -> (Step, HostMeta) {
    let (bucket, k) = (g.bucket, g.drafts);
    let mut host = HostMeta::default();
    let step = pack(lim, b, Some(g), &[], true, &mut host).unwrap();
    let mut eager_host = HostMeta::default();
    let eager = pack(lim, b, None, &[], true, &mut eager_host).unwrap();
    let (l, m) = (&step.layout, &host.meta);
    let (el, em) = (&eager.layout, &eager_host.meta);
    let (t, ns, real_ns) = (bucket * (k + 1), bucket * (k + 1), b.num_logit_rows());
    // The layout is the shape's, whatever the real batch.
    assert_eq!(
        *l,
        Layout::new(t, lim.max_seqs + 1, 0, bucket, 0, ns, host.edits.len(), 0)
    );
    assert_eq!((step.t, step.nd, step.nt, step.ns), (t, 0, bucket, ns));
    assert!(
        host.gemm.is_empty(),
        "no GEMM-path scratch planned per step"
    );
    // Real tokens, rows, tiles, sampled rows and arguments: as the eager packing has them.
    let n = b.num_tokens();
    for (sec, esec) in [
        (l.tokens, el.tokens),
        (l.positions, el.positions),
        (l.slots, el.slots),
    ] {
        assert_eq!(&m[sec..sec + n], &em[esec..esec + n]);
    }
    for q in &b.seqs {
        for (sec, esec) in [
            (l.ctx, el.ctx),
            (l.q_start, el.q_start),
            (l.q_len, el.q_len),
        ] {
            assert_eq!(m[sec + q.row], em[esec + q.row]);
        }
    }
    let real_tiles = b.seqs.len();
    assert_eq!(eager.nt, real_tiles);
    assert_eq!(
        &m[l.tile_seq..][..real_tiles],
        &em[el.tile_seq..][..real_tiles]
    );
    assert_eq!(
        &m[l.tile_q0..][..real_tiles],
        &em[el.tile_q0..][..real_tiles]
    );
    assert_eq!(
        &m[l.sample_rows..][..real_ns],
        &em[el.sample_rows..][..real_ns]
    );
    assert_eq!(
        &m[l.args..][..real_ns * ARG_WORDS],
        &em[el.args..][..real_ns * ARG_WORDS]
    );
    // Padding writes no K/V, reads the spare table row, and samples greedily.
    let pad_row = lim.max_seqs;
    for tok in n..t {
        assert_eq!(
            m[l.slots + tok],
            u32::MAX,
            "padding token {tok} is never cached"
        );
    }
    for tile in real_tiles..bucket {
        assert_eq!(
            (m[l.tile_seq + tile], m[l.tile_q0 + tile]),
            (pad_row as u32, 0)
        );
    }
    if bucket > b.seqs.len() {
        let c = (
            m[l.ctx + pad_row],
            m[l.q_start + pad_row],
            m[l.q_len + pad_row],
        );
        assert_eq!(c, ((k + 1) as u32, n as u32, (k + 1) as u32));
        assert!((k + 1).div_ceil(BS) <= lim.max_blocks);
    }
    for a in &host.args[real_ns..] {
        assert_eq!((a.temperature, a.num_edits, a.counts_row), (0.0, 0, -1));
    }
    assert_eq!(host.args.len(), ns);
    // Every sampled row is a query row some tile attends (its attention output is written).
    let attended = |row: u32| {
        (0..step.nt).any(|tile| {
            let seq = m[l.tile_seq + tile] as usize;
            let (q0, s0, len) = (m[l.tile_q0 + tile], m[l.q_start + seq], m[l.q_len + seq]);
            row >= s0 + q0 && row < s0 + len.min(q0 + PREFILL_TILE as u32)
        })
    };
    for k in 0..ns {
        let row = m[l.sample_rows + k];
        assert!(attended(row), "sampled row {row} is attended");
    }
    (step, host)
}

#[test]
fn verify_graph_padding_keeps_real_rows_and_writes_nothing() {
    let lim = limits();
    // Two verifications of 2 drafts in rows 0 and 2: bucket 4, two padding verifications.
    let mut b = BatchInput::default();
    verify(&mut b, 1, 2, 2, 20, 0);
    verify(&mut b, 2, 0, 2, 40, 10);
    let g = graph_shape(&b, &lim, true, true).unwrap();
    assert_eq!(
        g,
        GraphShape {
            bucket: 4,
            drafts: 2
        }
    );
    let (full, _) = pack_checked(&lim, &b, g);
    // One verification alone under the same shape (row 3): the same layout.
    let mut one = BatchInput::default();
    verify(&mut one, 3, 3, 2, 100, 30);
    assert_eq!(graph_shape(&one, &lim, true, true), Some(g));
    let (alone, _) = pack_checked(&lim, &one, g);
    assert_eq!(full.layout, alone.layout);
    // No padding at all (bucket 1), and one draft at a long context.
    let mut single = BatchInput::default();
    verify(&mut single, 4, 0, 1, 150, 40);
    let g1 = graph_shape(&single, &lim, true, true).unwrap();
    assert_eq!(
        g1,
        GraphShape {
            bucket: 1,
            drafts: 1
        }
    );
    pack_checked(&lim, &single, g1);
}

#[test]
fn a_verify_graph_plans_no_gemm_path_even_when_eager_would() {
    let (gemm_keys, gemm_scores) =
        crate::executor::cuda::prefill_gemm::scratch_capacity(64, 256, 8, 4);
    let lim = Limits {
        gemm_max_len: 64,
        gemm_keys,
        gemm_scores,
        ..limits()
    };
    let mut b = BatchInput::default();
    verify(&mut b, 1, 0, 3, 10, 0);
    let mut host = HostMeta::default();
    let eager = pack(&lim, &b, None, &[], true, &mut host).unwrap();
    assert_eq!((eager.nt, host.gemm.len()), (0, 1), "eager: the GEMM path");
    let g = graph_shape(&b, &lim, true, true).unwrap();
    let step = pack(&lim, &b, Some(g), &[], true, &mut host).unwrap();
    assert_eq!((step.nt, host.gemm.len()), (1, 0), "graph: one flash tile");
}

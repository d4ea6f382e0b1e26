//! The step-pipeline kernels: `feed_tokens` (lookahead decode's input tokens, copied on the
//! device from the last step's samples), `stamp` (the GPU's global timer, for step timing) and
//! `copy_out` (a step's outputs into its pinned stage; the engine passes mapped host memory, any
//! device address works, here device memory).

use brook::executor::cuda::kernels::{self, CopyOutParams, FeedTokensParams, StampParams};
use rand::Rng;

use crate::harness::{dev, poisoned, read, setup};

/// CPU reference of feed_tokens.cu: a sample inside the vocabulary is fed as is, anything else
/// (a failed step's sentinel) as token 0.
fn fed_ref(s: i32, vocab: i32) -> u32 {
    if (0..vocab).contains(&s) {
        s as u32
    } else {
        0
    }
}

#[test]
fn feed_tokens_copies_samples_inside_the_vocabulary() {
    let Some((g, mut r)) = setup(60) else { return };
    let vocab = 32_000;
    // Odd counts across block boundaries, with out-of-vocabulary and negative samples mixed in.
    for n in [1usize, 7, 255, 256, 257, 1000] {
        let mut sampled: Vec<i32> = (0..n).map(|_| r.random_range(0..vocab)).collect();
        for _ in 0..n.div_ceil(5) {
            let i = r.random_range(0..n);
            sampled[i] = match r.random_range(0..4) {
                0 => -1,
                1 => vocab,
                2 => i32::MAX,
                _ => i32::MIN,
            };
        }
        let sb = dev(&g, &sampled);
        // One word past the end stays poisoned: the kernel writes exactly n.
        let tokens = poisoned::<u32>(&g, n + 1);
        let p = FeedTokensParams {
            sampled: sb.ptr(),
            tokens: tokens.ptr(),
            n: n as i32,
            vocab,
        };
        unsafe { kernels::feed_tokens(&g, &p).unwrap() };
        let got: Vec<u32> = read(&g, &tokens, n + 1);
        let want: Vec<u32> = sampled.iter().map(|&s| fed_ref(s, vocab)).collect();
        assert_eq!(&got[..n], &want[..], "n {n}");
        assert_eq!(got[n], u32::MAX, "n {n}: wrote past the end");
    }
}

#[test]
fn stamp_writes_an_increasing_global_timer_into_its_slot() {
    let Some((g, _)) = setup(61) else { return };
    let stamps = poisoned::<u64>(&g, 3);
    let at = |slot| StampParams {
        stamps: stamps.ptr(),
        slot,
    };
    unsafe { kernels::stamp(&g, &at(0)).unwrap() };
    // Something between the stamps that takes a measurable time.
    let busy = poisoned::<u8>(&g, 64 << 20);
    g.memset(busy.ptr(), 0, 64 << 20).unwrap();
    unsafe { kernels::stamp(&g, &at(1)).unwrap() };
    let got: Vec<u64> = read(&g, &stamps, 3);
    assert_ne!(got[0], u64::MAX, "slot 0 not written");
    assert!(got[1] > got[0], "stamps {got:?} do not increase");
    // Nanoseconds: less than a second apart.
    assert!(got[1] - got[0] < 1_000_000_000, "stamps {got:?}");
    assert_eq!(got[2], u64::MAX, "wrote past slot 1");
    assert!(
        unsafe { kernels::stamp(&g, &at(2)) }.is_err(),
        "slot 2 accepted"
    );
}

#[test]
fn copy_out_copies_exactly_its_words() {
    let Some((g, mut r)) = setup(62) else { return };
    // Odd counts across block boundaries; one word past the end stays poisoned.
    for n in [1usize, 5, 255, 256, 257, 4099] {
        let src: Vec<u32> = (0..n).map(|_| r.random::<u32>() & 0x7fff_ffff).collect();
        let sb = dev(&g, &src);
        let dst = poisoned::<u32>(&g, n + 1);
        let p = CopyOutParams {
            src: sb.ptr(),
            dst: dst.ptr(),
            words: n as i32,
        };
        unsafe { kernels::copy_out(&g, &p).unwrap() };
        let got: Vec<u32> = read(&g, &dst, n + 1);
        assert_eq!(&got[..n], &src[..], "n {n}");
        assert_eq!(got[n], u32::MAX, "n {n}: wrote past the end");
    }
}

//! The test oracle: a plain Llama-family forward of one sequence, unbatched and unpaged, over all of its
//! positions at once with full causal attention, written with candle tensor ops as directly as the
//! transformers code reads. It shares only the weights (`ModelWeights`) and the RoPE frequency
//! formula with the engine's paged forward (`llama.rs`), not its attention, its fused projections
//! or its cache; it recomputes everything on every call, so it is slow and obviously stateless.

use candle_core::{Device, Tensor, D};
use candle_nn::Linear;

use crate::model::config::ModelConfig;
use crate::model::loader::ModelWeights;

/// Logits at every position of `tokens`, `[tokens.len(), vocab_size]`.
pub fn reference_logits(
    config: &ModelConfig,
    w: &ModelWeights,
    tokens: &[u32],
) -> candle_core::Result<Tensor> {
    let dev = Device::Cpu;
    let n = tokens.len();
    let (hd, nh, nkv) = (
        config.head_dim,
        config.num_attention_heads,
        config.num_key_value_heads,
    );
    let eps = config.rms_norm_eps;
    let (cos, sin) = rope_tables(config, n)?;
    let mask = causal_mask(n, config.sliding_window.unwrap_or(usize::MAX))?;
    let mut x = w
        .embed_tokens
        .index_select(&Tensor::new(tokens, &dev)?, 0)?;
    for layer in &w.layers {
        let h = rms_norm(&x, &layer.input_layernorm, eps)?;
        // [heads, n, head_dim]
        let heads =
            |t: Tensor, count: usize| t.reshape((n, count, hd))?.transpose(0, 1)?.contiguous();
        // Qwen3 normalises each head before RoPE.
        let head_norm = |t: Tensor, w: &Option<Tensor>| match w {
            Some(w) => rms_norm(&t, w, eps),
            None => Ok(t),
        };
        let q = head_norm(heads(linear(&h, &layer.q_proj)?, nh)?, &layer.q_norm)?;
        let k = head_norm(heads(linear(&h, &layer.k_proj)?, nkv)?, &layer.k_norm)?;
        let (q, k) = (rope(&q, &cos, &sin)?, rope(&k, &cos, &sin)?);
        let v = heads(linear(&h, &layer.v_proj)?, nkv)?;
        let (k, v) = (repeat_kv(&k, nh / nkv)?, repeat_kv(&v, nh / nkv)?);
        let scores =
            (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?.broadcast_add(&mask)?;
        let o = softmax(&scores)?.matmul(&v)?;
        let o = o.transpose(0, 1)?.contiguous()?.reshape((n, nh * hd))?;
        x = (x + linear(&o, &layer.o_proj)?)?;
        let h = rms_norm(&x, &layer.post_attention_layernorm, eps)?;
        let act = (silu(&linear(&h, &layer.gate_proj)?)? * linear(&h, &layer.up_proj)?)?;
        x = (x + linear(&act, &layer.down_proj)?)?;
    }
    linear(&rms_norm(&x, &w.norm, eps)?, &w.lm_head)
}

/// Greedy generation by recomputing the whole sequence each step: the generated tokens and, for
/// each, the logits row it was picked from (the prompt's last position first).
pub fn reference_greedy(
    config: &ModelConfig,
    w: &ModelWeights,
    prompt: &[u32],
    max_new_tokens: usize,
) -> candle_core::Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut seq = prompt.to_vec();
    let (mut out, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..max_new_tokens {
        let logits = reference_logits(config, w, &seq)?;
        let last: Vec<f32> = logits.get(seq.len() - 1)?.to_vec1()?;
        let token = crate::sampling::sampler::argmax(&last).0;
        out.push(token);
        rows.push(last);
        seq.push(token);
    }
    Ok((out, rows))
}

fn linear(x: &Tensor, l: &Linear) -> candle_core::Result<Tensor> {
    let y = x.matmul(&l.weight().t()?)?;
    match l.bias() {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
    x.broadcast_div(&rms)?.broadcast_mul(weight)
}

fn silu(x: &Tensor) -> candle_core::Result<Tensor> {
    x * candle_nn::ops::sigmoid(x)?
}

fn softmax(x: &Tensor) -> candle_core::Result<Tensor> {
    let e = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// `[n, n]`: 0 where key j is visible to query i (i - window < j <= i), -inf elsewhere.
fn causal_mask(n: usize, window: usize) -> candle_core::Result<Tensor> {
    let m: Vec<f32> = (0..n * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            if j > i || i - j >= window {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(m, (n, n), &Device::Cpu)
}

/// cos and sin of `pos · inv_freq` (times the attention factor of longrope), `[n, head_dim]` with
/// the half-table repeated (rotate_half form).
fn rope_tables(config: &ModelConfig, n: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let inv = config.rope.inv_freqs(config.head_dim);
    let mscale = config.rope.attention_factor();
    let angles: Vec<f64> = (0..n)
        .flat_map(|p| inv.iter().chain(&inv).map(move |f| p as f64 * f))
        .collect();
    let table = |f: fn(f64) -> f64| {
        let v: Vec<f32> = angles.iter().map(|&a| (f(a) * mscale) as f32).collect();
        Tensor::from_vec(v, (n, config.head_dim), &Device::Cpu)
    };
    Ok((table(f64::cos)?, table(f64::sin)?))
}

/// `x·cos + rotate_half(x)·sin` for `x` of `[heads, n, head_dim]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let rotated = Tensor::cat(
        &[
            &x.narrow(D::Minus1, half, half)?.neg()?,
            &x.narrow(D::Minus1, 0, half)?,
        ],
        D::Minus1,
    )?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// `[kv_heads, n, d]` → `[kv_heads·group, n, d]`, query head `h` seeing kv head `h / group`.
fn repeat_kv(x: &Tensor, group: usize) -> candle_core::Result<Tensor> {
    let (kvh, n, d) = x.dims3()?;
    x.unsqueeze(1)?
        .expand((kvh, group, n, d))?
        .contiguous()?
        .reshape((kvh * group, n, d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::loader::load_weights;
    use crate::model::testing::{write_test_model, TestModelSpec};

    #[test]
    fn logits_of_a_prefix_do_not_depend_on_later_tokens() {
        let dir = tempfile::tempdir().unwrap();
        write_test_model(dir.path(), &TestModelSpec::default()).unwrap();
        let config = ModelConfig::from_dir(dir.path()).unwrap();
        let w = load_weights(dir.path(), &config, false).unwrap();
        let tokens: Vec<u32> = (0..24)
            .map(|i| (i * 53 + 7) % config.vocab_size as u32)
            .collect();
        let full: Vec<Vec<f32>> = reference_logits(&config, &w, &tokens)
            .unwrap()
            .to_vec2()
            .unwrap();
        let prefix: Vec<Vec<f32>> = reference_logits(&config, &w, &tokens[..10])
            .unwrap()
            .to_vec2()
            .unwrap();
        for (a, b) in full.iter().zip(&prefix) {
            assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5));
        }
        // ... while a changed earlier token changes every later position.
        let mut changed = tokens.clone();
        changed[3] = (changed[3] + 1) % config.vocab_size as u32;
        let other: Vec<Vec<f32>> = reference_logits(&config, &w, &changed)
            .unwrap()
            .to_vec2()
            .unwrap();
        assert_eq!(full[2], other[2]);
        assert!(full[3..].iter().zip(&other[3..]).all(|(a, b)| a != b));
    }
}

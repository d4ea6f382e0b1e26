//! Tensor-parallel shards of a Llama-family model, Megatron-style: rank r of N holds
//! - the query heads [r·H/N, (r+1)·H/N) of q_proj's rows and o_proj's columns, and the key/value
//!   heads they read (KV heads split with them, or, with fewer KV heads than ranks, the one KV
//!   head of the rank's group, replicated as vLLM does);
//! - the slice [r·I/N, (r+1)·I/N) of the MLP: gate/up rows (column parallel), down columns (row
//!   parallel);
//! - the vocabulary rows [r·V', (r+1)·V') of the embedding and the LM head, V' = ⌈V/N⌉, the
//!   last rank's padded with zero rows so every rank's logits slice has the same width;
//! - the norms whole.
//!
//! A rank's shard is itself a smaller model (`shard_config`: H/N heads, I/N intermediate, the
//! full vocabulary and hidden size): the forward runs it as it runs any model, plus an
//! all-reduce after o_proj and down_proj (each rank holds a partial sum of their products; their
//! biases stay on rank 0 so they are added once) and the vocabulary-parallel embedding and
//! logits (`llama::TpRank`).

use candle_core::Tensor;
use candle_nn::Linear;

use crate::model::config::ModelConfig;
use crate::model::loader::{LayerWeights, ModelWeights, EMBED, LM_HEAD};

/// Why a model cannot be split over `world` ranks; None when it can.
pub fn split_error(config: &ModelConfig, world: usize) -> Option<String> {
    let (h, kv, i) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
    );
    let why = if world == 0 {
        "the tensor-parallel size must be at least 1".to_owned()
    } else if h % world != 0 {
        format!("its {h} attention heads do not divide over {world} ranks")
    } else if kv % world != 0 && world % kv != 0 {
        format!(
            "its {kv} key/value heads neither divide over {world} ranks nor divide {world} (to be replicated)"
        )
    } else if i % world != 0 {
        format!("its MLP width {i} (intermediate_size) does not divide over {world} ranks")
    } else {
        return None;
    };
    Some(why)
}

/// Checks that the model splits over `world` ranks, with a message that says why not.
pub fn check_split(config: &ModelConfig, world: usize) -> anyhow::Result<()> {
    match split_error(config, world) {
        None => Ok(()),
        Some(why) => anyhow::bail!(
            "--tensor-parallel-size {world} does not fit this model: {why}; pick a size that divides the attention heads and the MLP width"
        ),
    }
}

/// The model one rank runs: H/N query heads, KV heads split (or one, replicated), I/N MLP width.
/// Vocabulary and hidden size stay whole (the embedding and logits are sliced by the rank).
pub fn shard_config(config: &ModelConfig, world: usize) -> ModelConfig {
    let mut c = config.clone();
    c.num_attention_heads /= world;
    c.num_key_value_heads = (config.num_key_value_heads / world).max(1);
    c.intermediate_size /= world;
    c
}

/// Rows of the vocabulary each rank holds (the last rank's padded with zeros).
pub fn vocab_rows(vocab: usize, world: usize) -> usize {
    vocab.div_ceil(world)
}

/// Where rank `rank`'s slices lie in the whole model's tensors, as (first, count) along the
/// split dimension: query rows (q_proj rows, o_proj columns), one of k/v's row blocks, MLP
/// rows (gate/up rows, down columns), vocabulary rows.
#[derive(Debug, Clone, Copy)]
struct Slices {
    q: (usize, usize),
    kv: (usize, usize),
    mlp: (usize, usize),
    vocab: (usize, usize),
    lead: bool,
}

impl Slices {
    fn of(config: &ModelConfig, rank: usize, world: usize) -> anyhow::Result<Slices> {
        check_split(config, world)?;
        anyhow::ensure!(rank < world, "rank {rank} of a world of {world}");
        let hd = config.head_dim;
        let q = config.num_attention_heads / world * hd;
        let kv_heads = config.num_key_value_heads;
        // The rank's first KV head: its own slice, or its group's head when replicated.
        let (kv0, kv) = match kv_heads % world {
            0 => (rank * kv_heads / world, kv_heads / world),
            _ => (rank / (world / kv_heads), 1),
        };
        let i = config.intermediate_size / world;
        let rows = vocab_rows(config.vocab_size, world);
        Ok(Slices {
            q: (rank * q, q),
            kv: (kv0 * hd, kv * hd),
            mlp: (rank * i, i),
            vocab: (rank * rows, rows),
            lead: rank == 0,
        })
    }
}

/// Rank `rank`'s shard of `w` (the whole model's weights, `config`'s shapes).
pub fn shard_weights(
    config: &ModelConfig,
    w: &ModelWeights,
    rank: usize,
    world: usize,
) -> anyhow::Result<ModelWeights> {
    let s = Slices::of(config, rank, world)?;
    let layers = w
        .layers
        .iter()
        .map(|l| -> candle_core::Result<LayerWeights> {
            Ok(LayerWeights {
                input_layernorm: l.input_layernorm.clone(),
                q_proj: column(&l.q_proj, s.q)?,
                k_proj: column(&l.k_proj, s.kv)?,
                v_proj: column(&l.v_proj, s.kv)?,
                o_proj: row(&l.o_proj, s.q, s.lead)?,
                post_attention_layernorm: l.post_attention_layernorm.clone(),
                gate_proj: column(&l.gate_proj, s.mlp)?,
                up_proj: column(&l.up_proj, s.mlp)?,
                down_proj: row(&l.down_proj, s.mlp, s.lead)?,
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
            })
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    let embed_tokens = vocab_slice(&w.embed_tokens, s.vocab)?;
    let lm_head = match w.lm_head_tied {
        true => Linear::new(embed_tokens.clone(), None),
        false => Linear::new(vocab_slice(w.lm_head.weight(), s.vocab)?, None),
    };
    Ok(ModelWeights {
        embed_tokens,
        layers,
        norm: w.norm.clone(),
        lm_head,
        lm_head_tied: w.lm_head_tied,
    })
}

/// Rank `rank`'s part of the checkpoint tensor `name` (its checkpoint shape and dtype), cut as
/// `shard_weights` cuts the loaded model, for loaders that stream a checkpoint tensor by tensor
/// (`model::fused`). Phi-3's fused `qkv_proj` and `gate_up_proj` are cut part by part and their
/// pieces kept in order. o and down biases are not handled (no streaming layout holds them).
pub fn shard_tensor(
    config: &ModelConfig,
    name: &str,
    t: &Tensor,
    rank: usize,
    world: usize,
) -> anyhow::Result<Tensor> {
    let s = Slices::of(config, rank, world)?;
    let (q, kv, i) = (config.q_dim(), config.kv_dim(), config.intermediate_size);
    let rows = |(first, n): (usize, usize)| t.narrow(0, first, n);
    let at = |base: usize, (first, n): (usize, usize)| (base + first, n);
    if name == EMBED || name == LM_HEAD {
        return Ok(vocab_slice(t, s.vocab)?);
    }
    let part = name
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'))
        .map_or("", |(_, part)| part);
    let cut = match part {
        "self_attn.q_proj.weight" | "self_attn.q_proj.bias" => rows(s.q)?,
        "self_attn.k_proj.weight"
        | "self_attn.k_proj.bias"
        | "self_attn.v_proj.weight"
        | "self_attn.v_proj.bias" => rows(s.kv)?,
        "self_attn.qkv_proj.weight" | "self_attn.qkv_proj.bias" => Tensor::cat(
            &[rows(s.q)?, rows(at(q, s.kv))?, rows(at(q + kv, s.kv))?],
            0,
        )?,
        "self_attn.o_proj.weight" => t.narrow(1, s.q.0, s.q.1)?,
        "mlp.gate_proj.weight" | "mlp.up_proj.weight" => rows(s.mlp)?,
        "mlp.gate_up_proj.weight" => Tensor::cat(&[rows(s.mlp)?, rows(at(i, s.mlp))?], 0)?,
        "mlp.down_proj.weight" => t.narrow(1, s.mlp.0, s.mlp.1)?,
        "self_attn.o_proj.bias" | "mlp.down_proj.bias" => {
            anyhow::bail!("{name}: o and down biases are not split tensor by tensor")
        }
        // Norms (the layers' and the final one, Qwen3's head norms) stay whole.
        _ => t.clone(),
    };
    Ok(cut.contiguous()?)
}

/// Column parallel: output rows [first, first + n) of the weight and of the bias.
fn column(l: &Linear, (first, n): (usize, usize)) -> candle_core::Result<Linear> {
    let w = l.weight().narrow(0, first, n)?.contiguous()?;
    let b = l
        .bias()
        .map(|b| b.narrow(0, first, n)?.contiguous())
        .transpose()?;
    Ok(Linear::new(w, b))
}

/// Row parallel: input columns [first, first + n); the bias only on the lead rank (the
/// all-reduce adds the ranks' products, the bias once).
fn row(l: &Linear, (first, n): (usize, usize), lead: bool) -> candle_core::Result<Linear> {
    let w = l.weight().narrow(1, first, n)?.contiguous()?;
    Ok(Linear::new(w, l.bias().filter(|_| lead).cloned()))
}

/// Rows [first, first + n) of a `[vocab, hidden]` matrix, zero rows past its end.
fn vocab_slice(t: &Tensor, (first, n): (usize, usize)) -> candle_core::Result<Tensor> {
    let (vocab, hidden) = t.dims2()?;
    let have = n.min(vocab.saturating_sub(first));
    let part = t.narrow(0, first.min(vocab), have)?;
    match have == n {
        true => part.contiguous(),
        false => {
            let pad = Tensor::zeros((n - have, hidden), t.dtype(), t.device())?;
            Tensor::cat(&[&part, &pad], 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::{load_test_model, TestModelSpec};

    fn rows_of(t: &Tensor) -> Vec<Vec<f32>> {
        t.to_vec2::<f32>().unwrap()
    }

    #[test]
    fn split_errors_name_what_does_not_divide() {
        let (_d, config, _) =
            load_test_model(&TestModelSpec::default().heads(4, 2).intermediate_size(160));
        assert_eq!(split_error(&config, 1), None);
        assert_eq!(split_error(&config, 2), None);
        // 4 ranks over 2 KV heads: each KV head replicated on two ranks.
        assert_eq!(split_error(&config, 4), None);
        for (world, what) in [
            (0, "at least 1"),
            (3, "4 attention heads"),
            (8, "4 attention heads"),
        ] {
            let why = split_error(&config, world).unwrap();
            assert!(why.contains(what), "{world}: {why}");
        }
        let (_d, config, _) =
            load_test_model(&TestModelSpec::default().heads(4, 2).intermediate_size(162));
        assert!(split_error(&config, 4).unwrap().contains("MLP width 162"));
        let (_d, config, _) = load_test_model(&TestModelSpec::default().heads(6, 3).head_dim(16));
        let why = split_error(&config, 2).unwrap();
        assert!(why.contains("3 key/value heads"), "{why}");
        let err = check_split(&config, 2).unwrap_err().to_string();
        assert!(err.contains("--tensor-parallel-size 2"), "{err}");
    }

    /// The ranks' shards put back together are the model: q/k/v rows and o columns by head,
    /// gate/up rows and down columns by MLP slice, vocabulary rows padded with zeros; the row-
    /// parallel biases on rank 0 only.
    #[test]
    fn shards_cover_the_model_in_rank_order() {
        let spec = TestModelSpec::default()
            .heads(4, 2)
            .attention_bias(true)
            .vocab_size(601);
        let (_d, config, w) = load_test_model(&spec);
        let world = 2;
        let shards: Vec<ModelWeights> = (0..world)
            .map(|r| shard_weights(&config, &w, r, world).unwrap())
            .collect();
        let cat = |f: &dyn Fn(&ModelWeights) -> Tensor, dim| {
            let parts: Vec<Tensor> = shards.iter().map(f).collect();
            Tensor::cat(&parts, dim).unwrap()
        };
        let l0 = &w.layers[0];
        let same = |a: &Tensor, b: &Tensor| assert_eq!(rows_of(a), rows_of(b));
        same(
            &cat(&|s| s.layers[0].q_proj.weight().clone(), 0),
            l0.q_proj.weight(),
        );
        same(
            &cat(&|s| s.layers[0].k_proj.weight().clone(), 0),
            l0.k_proj.weight(),
        );
        same(
            &cat(&|s| s.layers[0].o_proj.weight().clone(), 1),
            l0.o_proj.weight(),
        );
        same(
            &cat(&|s| s.layers[0].up_proj.weight().clone(), 0),
            l0.up_proj.weight(),
        );
        same(
            &cat(&|s| s.layers[0].down_proj.weight().clone(), 1),
            l0.down_proj.weight(),
        );
        let qb = cat(&|s| s.layers[0].q_proj.bias().unwrap().clone(), 0);
        assert_eq!(
            qb.to_vec1::<f32>().unwrap(),
            l0.q_proj.bias().unwrap().to_vec1::<f32>().unwrap()
        );
        assert!(shards[0].layers[0].o_proj.bias().is_some());
        assert!(shards[1].layers[0].o_proj.bias().is_none());
        // 601 rows over 2 ranks: 301 each, the last row of rank 1 zeros.
        let embed = rows_of(&cat(&|s| s.embed_tokens.clone(), 0));
        assert_eq!(embed.len(), 602);
        assert_eq!(embed[..601], rows_of(&w.embed_tokens)[..]);
        assert!(embed[601].iter().all(|&v| v == 0.0));
        let head = rows_of(&cat(&|s| s.lm_head.weight().clone(), 0));
        assert_eq!(head[..601], rows_of(w.lm_head.weight())[..]);
    }

    /// With more ranks than KV heads, each rank holds its query heads' one KV head.
    #[test]
    fn fewer_kv_heads_than_ranks_are_replicated() {
        let (_d, config, w) = load_test_model(&TestModelSpec::default().heads(4, 2));
        let hd = config.head_dim;
        let k = rows_of(w.layers[1].k_proj.weight());
        for rank in 0..4 {
            let s = shard_weights(&config, &w, rank, 4).unwrap();
            // Query heads 0-1 read KV head 0, heads 2-3 KV head 1.
            let head = rank / 2;
            assert_eq!(
                rows_of(s.layers[1].k_proj.weight()),
                k[head * hd..(head + 1) * hd],
                "rank {rank}"
            );
        }
        let c = shard_config(&config, 4);
        assert_eq!((c.num_attention_heads, c.num_key_value_heads), (1, 1));
        assert_eq!(c.intermediate_size, config.intermediate_size / 4);
        assert_eq!(c.vocab_size, config.vocab_size);
    }
}

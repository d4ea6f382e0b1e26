//! The checkpoint in the CUDA executor's bf16 layout, streamed tensor by tensor: each tensor is
//! converted to bf16 on its own (bf16 kept as is, f16 and f32 rounded to nearest even, exactly
//! what candle's `to_dtype` does) and placed at its rows in a fused matrix: q|k|v into one `qkv`,
//! gate|up into one `gate_up` (Phi-3 checkpoints store them fused already), q|k|v biases into one
//! `qkv_bias`. The whole model never exists in f32, nor in bf16 on the host.

use std::path::Path;

use anyhow::Context;
use candle_core::DType;
use half::bf16;

use crate::model::config::ModelConfig;
use crate::model::loader::{for_each_tensor, EMBED, LM_HEAD};
use crate::model::shard::{shard_config, shard_tensor, vocab_rows};
use crate::model::ModelError;

/// A weight matrix or vector of the fused layout; per-layer ones carry the layer index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fused {
    /// `[vocab, hidden]`
    Embed,
    /// `[hidden]`
    InputNorm(usize),
    /// `[(heads + 2 * kv_heads) * head_dim, hidden]`: q, k, v rows in that order.
    Qkv(usize),
    /// `[(heads + 2 * kv_heads) * head_dim]`: q, k, v biases (only when `qkv_bias`).
    QkvBias(usize),
    /// `[head_dim]`: Qwen3's RMSNorm weights of each query / key head (only when `qk_norm`).
    QNorm(usize),
    KNorm(usize),
    /// `[hidden, heads * head_dim]`
    O(usize),
    /// `[hidden]`
    PostNorm(usize),
    /// `[2 * intermediate, hidden]`: gate rows, then up rows.
    GateUp(usize),
    /// `[hidden, intermediate]`
    Down(usize),
    /// `[hidden]`
    Norm,
    /// `[vocab, hidden]`; absent when tied to the embeddings.
    LmHead,
}

impl Fused {
    /// Elements of this tensor under `cfg`.
    pub fn len(self, cfg: &ModelConfig) -> usize {
        let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        match self {
            Fused::Embed | Fused::LmHead => v * h,
            Fused::InputNorm(_) | Fused::PostNorm(_) | Fused::Norm => h,
            Fused::Qkv(_) => (cfg.q_dim() + 2 * cfg.kv_dim()) * h,
            Fused::QkvBias(_) => cfg.q_dim() + 2 * cfg.kv_dim(),
            Fused::QNorm(_) | Fused::KNorm(_) => cfg.head_dim,
            Fused::O(_) => h * cfg.q_dim(),
            Fused::GateUp(_) => 2 * i * h,
            Fused::Down(_) => h * i,
        }
    }

    /// Elements of this tensor on one of `world` tensor-parallel ranks of the model `cfg`
    /// (`shard::shard_config`'s shapes; the embedding and LM head hold the rank's vocabulary
    /// rows).
    pub fn split_len(self, cfg: &ModelConfig, world: usize) -> usize {
        match self {
            Fused::Embed | Fused::LmHead => vocab_rows(cfg.vocab_size, world) * cfg.hidden_size,
            _ => self.len(&shard_config(cfg, world)),
        }
    }

    /// Every tensor of `cfg`'s layout, `LmHead` only when `untied_head`.
    pub fn all(cfg: &ModelConfig, untied_head: bool) -> Vec<Fused> {
        let mut out = vec![Fused::Embed];
        for l in 0..cfg.num_hidden_layers {
            out.extend([
                Fused::InputNorm(l),
                Fused::Qkv(l),
                Fused::O(l),
                Fused::PostNorm(l),
                Fused::GateUp(l),
                Fused::Down(l),
            ]);
            if cfg.qkv_bias {
                out.push(Fused::QkvBias(l));
            }
            if cfg.qk_norm {
                out.extend([Fused::QNorm(l), Fused::KNorm(l)]);
            }
        }
        out.push(Fused::Norm);
        if untied_head {
            out.push(Fused::LmHead);
        }
        out
    }
}

/// Where the checkpoint tensor `name` lands: its fused tensor and the element offset of its
/// first row there. `None` for names outside the model (and for o and MLP biases, which the
/// layout has no room for).
pub fn placement(cfg: &ModelConfig, name: &str) -> Option<(Fused, usize)> {
    let h = cfg.hidden_size;
    match name {
        EMBED => return Some((Fused::Embed, 0)),
        "model.norm.weight" => return Some((Fused::Norm, 0)),
        LM_HEAD => return Some((Fused::LmHead, 0)),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let l: usize = layer.parse().ok()?;
    if l >= cfg.num_hidden_layers {
        return None;
    }
    let (q, kv) = (cfg.q_dim(), cfg.kv_dim());
    Some(match part {
        "input_layernorm.weight" => (Fused::InputNorm(l), 0),
        "self_attn.q_proj.weight" | "self_attn.qkv_proj.weight" => (Fused::Qkv(l), 0),
        "self_attn.k_proj.weight" => (Fused::Qkv(l), q * h),
        "self_attn.v_proj.weight" => (Fused::Qkv(l), (q + kv) * h),
        "self_attn.q_proj.bias" | "self_attn.qkv_proj.bias" => (Fused::QkvBias(l), 0),
        "self_attn.k_proj.bias" => (Fused::QkvBias(l), q),
        "self_attn.v_proj.bias" => (Fused::QkvBias(l), q + kv),
        "self_attn.q_norm.weight" => (Fused::QNorm(l), 0),
        "self_attn.k_norm.weight" => (Fused::KNorm(l), 0),
        "self_attn.o_proj.weight" => (Fused::O(l), 0),
        "post_attention_layernorm.weight" => (Fused::PostNorm(l), 0),
        "mlp.gate_proj.weight" | "mlp.gate_up_proj.weight" => (Fused::GateUp(l), 0),
        "mlp.up_proj.weight" => (Fused::GateUp(l), cfg.intermediate_size * h),
        "mlp.down_proj.weight" => (Fused::Down(l), 0),
        _ => return None,
    })
}

/// Reads the checkpoint in `dir` one tensor at a time and hands each to `sink` as bf16 with its
/// place: the fused tensor and the element offset of its first row, with the run checked to lie
/// inside the fused tensor. Returns whether `lm_head` is tied to the embeddings (by the config,
/// or because an untied checkpoint lacks it, as `load_weights` decides); then no `LmHead` comes.
///
/// Split over `world` tensor-parallel ranks (1: none), each tensor is cut into the ranks' parts
/// (`shard::shard_tensor`) and each part handed to `sink` with its rank and its place in that
/// rank's layout (`shard_config`'s shapes, the embedding and LM head `split_len` long), so the
/// host never holds more than one tensor.
pub fn load_bf16(
    dir: &Path,
    cfg: &ModelConfig,
    world: usize,
    progress: bool,
    mut sink: impl FnMut(usize, Fused, usize, &[bf16]) -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    anyhow::ensure!(
        !cfg.o_bias && !cfg.mlp_bias,
        "the fused bf16 layout has no room for o-projection or MLP biases"
    );
    let rank_cfg = shard_config(cfg, world);
    for_each_tensor(dir, cfg, progress, |name, raw| {
        let (fused, offset) = placement(&rank_cfg, name)
            .with_context(|| format!("tensor {name} has no place in the fused layout"))?;
        for rank in 0..world {
            let part = match world {
                1 => raw.clone(),
                _ => shard_tensor(cfg, name, &raw, rank, world)?,
            };
            let values = part
                .to_dtype(DType::BF16)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<bf16>())
                .map_err(|e| ModelError::Tensor {
                    name: name.to_owned(),
                    reason: e,
                })?;
            anyhow::ensure!(
                offset + values.len() <= fused.split_len(cfg, world),
                "tensor {name} overruns {fused:?}"
            );
            sink(rank, fused, offset, &values).with_context(|| format!("tensor {name}"))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::Tensor;

    use super::*;
    use crate::model::config::WeightDType;
    use crate::model::loader::{load_weights, ModelWeights};
    use crate::model::testing::{write_test_model, TestModelSpec};

    type Layout = HashMap<Fused, Vec<bf16>>;

    /// The fused tensors `load_bf16` streams for each of `world` ranks, assembled on the host;
    /// each element written once.
    fn streamed_split(dir: &Path, cfg: &ModelConfig, world: usize) -> (Vec<Layout>, bool) {
        // Each rank's tensors, and which of their elements were written.
        type Written = HashMap<Fused, (Vec<bf16>, Vec<bool>)>;
        let mut out: Vec<Written> = vec![HashMap::new(); world];
        let tied = load_bf16(dir, cfg, world, false, |rank, t, offset, values| {
            let n = t.split_len(cfg, world);
            let (buf, written) = out[rank]
                .entry(t)
                .or_insert_with(|| (vec![bf16::ZERO; n], vec![false; n]));
            for (i, v) in values.iter().enumerate() {
                assert!(!written[offset + i], "{t:?}[{}] written twice", offset + i);
                written[offset + i] = true;
                buf[offset + i] = *v;
            }
            Ok(())
        })
        .unwrap();
        let out = out
            .into_iter()
            .map(|rank| {
                rank.into_iter()
                    .map(|(t, (buf, written))| {
                        assert!(written.iter().all(|&w| w), "{t:?} not fully written");
                        (t, buf)
                    })
                    .collect()
            })
            .collect();
        (out, tied)
    }

    /// The fused tensors `load_bf16` streams unsplit.
    fn streamed(dir: &Path, cfg: &ModelConfig) -> (Layout, bool) {
        let (mut ranks, tied) = streamed_split(dir, cfg, 1);
        (ranks.remove(0), tied)
    }

    /// What the f32 path uploads: each fused tensor as its parts' f32 values rounded to bf16,
    /// rows appended in order.
    fn via_f32(w: &ModelWeights, cfg: &ModelConfig) -> HashMap<Fused, Vec<bf16>> {
        let bf = |parts: &[&Tensor]| -> Vec<bf16> {
            parts
                .iter()
                .flat_map(|t| {
                    t.to_dtype(DType::BF16)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<bf16>()
                        .unwrap()
                })
                .collect()
        };
        let mut out = HashMap::new();
        out.insert(Fused::Embed, bf(&[&w.embed_tokens]));
        for (l, x) in w.layers.iter().enumerate() {
            out.insert(Fused::InputNorm(l), bf(&[&x.input_layernorm]));
            out.insert(
                Fused::Qkv(l),
                bf(&[x.q_proj.weight(), x.k_proj.weight(), x.v_proj.weight()]),
            );
            out.insert(Fused::O(l), bf(&[x.o_proj.weight()]));
            out.insert(Fused::PostNorm(l), bf(&[&x.post_attention_layernorm]));
            out.insert(
                Fused::GateUp(l),
                bf(&[x.gate_proj.weight(), x.up_proj.weight()]),
            );
            out.insert(Fused::Down(l), bf(&[x.down_proj.weight()]));
            if let (Some(q), Some(k), Some(v)) = (x.q_proj.bias(), x.k_proj.bias(), x.v_proj.bias())
            {
                out.insert(Fused::QkvBias(l), bf(&[q, k, v]));
            }
            if let (Some(q), Some(k)) = (&x.q_norm, &x.k_norm) {
                out.insert(Fused::QNorm(l), bf(&[q]));
                out.insert(Fused::KNorm(l), bf(&[k]));
            }
        }
        out.insert(Fused::Norm, bf(&[&w.norm]));
        if !w.lm_head_tied {
            out.insert(Fused::LmHead, bf(&[w.lm_head.weight()]));
        }
        assert_eq!(out.len(), Fused::all(cfg, !w.lm_head_tied).len());
        out
    }

    /// Streams `dir` and checks it bit for bit against the f32 loader's tensors; returns `tied`.
    fn check(dir: &Path) -> bool {
        let cfg = ModelConfig::from_dir(dir).unwrap();
        let (got, tied) = streamed(dir, &cfg);
        let w = load_weights(dir, &cfg, false).unwrap();
        assert_eq!(tied, w.lm_head_tied);
        same(&got, &via_f32(&w, &cfg), |k| k.len(&cfg), "");
        tied
    }

    /// `got` and `want` hold the same tensors, bit for bit, of `len` elements, none all zeros.
    fn same(got: &Layout, want: &Layout, len: impl Fn(Fused) -> usize, what: &str) {
        let mut keys: Vec<_> = want.keys().copied().collect();
        keys.sort();
        let mut got_keys: Vec<_> = got.keys().copied().collect();
        got_keys.sort();
        assert_eq!(got_keys, keys, "{what}");
        for k in keys {
            let (g, w) = (&got[&k], &want[&k]);
            assert_eq!(g.len(), len(k), "{what} {k:?}");
            let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(g) == bits(w), "{what} {k:?} differs");
            assert!(
                g.iter().any(|x| x.to_f32() != 0.0),
                "{what} {k:?} is all zeros"
            );
        }
    }

    /// Streams `dir` split over `world` ranks and checks each rank's tensors bit for bit against
    /// its shard of the f32 loader's model (`shard_weights`).
    fn check_split(dir: &Path, world: usize) {
        let cfg = ModelConfig::from_dir(dir).unwrap();
        let (got, tied) = streamed_split(dir, &cfg, world);
        let w = load_weights(dir, &cfg, false).unwrap();
        assert_eq!(tied, w.lm_head_tied);
        let rank_cfg = shard_config(&cfg, world);
        for (rank, got) in got.iter().enumerate() {
            let shard = crate::model::shard::shard_weights(&cfg, &w, rank, world).unwrap();
            let what = format!("{} rank {rank} of {world}", dir.display());
            same(
                got,
                &via_f32(&shard, &rank_cfg),
                |k| k.split_len(&cfg, world),
                &what,
            );
        }
    }

    fn written(spec: &TestModelSpec) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write_test_model(dir.path(), spec).unwrap();
        dir
    }

    #[test]
    fn demo_model_streams_to_the_f32_paths_values() {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/demo-chat");
        assert!(check(&demo), "the demo model ties its embeddings");
    }

    #[test]
    fn every_dtype_and_sharding_streams_to_the_f32_paths_values() {
        for dtype in [WeightDType::BF16, WeightDType::F16, WeightDType::F32] {
            let spec = TestModelSpec::default().dtype(dtype).seed(11);
            assert!(!check(written(&spec).path()), "{dtype:?}");
        }
        let sharded = TestModelSpec::default().heads(4, 4).shards(3).seed(12);
        assert!(!check(written(&sharded).path()));
        assert!(check(written(&TestModelSpec::default().tied(true)).path()));
    }

    /// Split over ranks: KV heads split and replicated, a vocabulary the ranks do not divide
    /// (the last rank's rows padded), tied embeddings, a checkpoint in several files, every
    /// dtype, and every family (Phi-3's fused qkv_proj and gate_up_proj cut part by part).
    #[test]
    fn a_split_streams_each_rank_its_shard_of_the_f32_paths_values() {
        for dtype in [WeightDType::BF16, WeightDType::F32] {
            let spec = TestModelSpec::default().dtype(dtype).heads(4, 2).seed(13);
            let dir = written(&spec);
            check_split(dir.path(), 2);
            check_split(dir.path(), 4);
        }
        let odd = TestModelSpec::default()
            .heads(4, 4)
            .vocab_size(601)
            .tied(true)
            .shards(3)
            .seed(14);
        check_split(written(&odd).path(), 2);
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        for family in ["llama3", "mistral", "qwen2", "qwen3", "phi3"] {
            let dir = fixtures.join(family);
            let cfg = ModelConfig::from_dir(&dir).unwrap();
            if crate::model::shard::split_error(&cfg, 2).is_none() {
                check_split(&dir, 2);
            } else {
                panic!("{family} does not split over 2: pick a fixture that does");
            }
        }
    }

    /// Every family's layout: Phi-3's fused qkv_proj / gate_up_proj land in place, Qwen2's q/k/v
    /// biases in `QkvBias`, Qwen3's head norms in `QNorm`/`KNorm` (the transformers checkpoints of
    /// tests/fixtures/models).
    #[test]
    fn every_family_streams_to_the_f32_paths_values() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        for (family, tied) in [
            ("llama3", false),
            ("mistral", false),
            ("qwen2", true),
            ("qwen3", true),
            ("phi3", false),
        ] {
            assert_eq!(check(&fixtures.join(family)), tied, "{family}");
        }
        let cfg = ModelConfig::from_dir(&fixtures.join("qwen2")).unwrap();
        assert!(Fused::all(&cfg, false).contains(&Fused::QkvBias(1)));
        let cfg = ModelConfig::from_dir(&fixtures.join("qwen3")).unwrap();
        assert!(Fused::all(&cfg, false).contains(&Fused::KNorm(0)));
    }

    #[test]
    fn untied_config_without_lm_head_streams_as_tied() {
        let dir = written(&TestModelSpec::default().tied(true));
        let path = dir.path().join("config.json");
        let json = std::fs::read_to_string(&path).unwrap().replace(
            "\"tie_word_embeddings\": true",
            "\"tie_word_embeddings\": false",
        );
        std::fs::write(&path, json).unwrap();
        let cfg = ModelConfig::from_dir(dir.path()).unwrap();
        assert!(!cfg.tie_word_embeddings);
        let (got, tied) = streamed(dir.path(), &cfg);
        assert!(tied && !got.contains_key(&Fused::LmHead));
    }

    #[test]
    fn biases_and_sink_errors_are_reported() {
        let dir = written(&TestModelSpec::default().attention_bias(true));
        let cfg = ModelConfig::from_dir(dir.path()).unwrap();
        let err = load_bf16(dir.path(), &cfg, 1, false, |_, _, _, _| Ok(())).unwrap_err();
        assert!(err.to_string().contains("biases"), "{err}");
        let dir = written(&TestModelSpec::default());
        let cfg = ModelConfig::from_dir(dir.path()).unwrap();
        let err = load_bf16(dir.path(), &cfg, 1, false, |_, t, _, _| {
            anyhow::ensure!(t != Fused::Down(1), "device full");
            Ok(())
        })
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("down_proj") && msg.contains("device full"),
            "{msg}"
        );
    }
}

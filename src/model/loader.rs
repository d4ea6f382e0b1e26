//! Weights of a Llama-family checkpoint (every `model::arch` family): `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`, in bf16, f16 or f32, converted to f32 candle tensors on the CPU.
//!
//! Shards are read one at a time, so peak memory is the f32 weights plus one shard. Tensors the
//! model does not use (e.g. old `rotary_emb.inv_freq` buffers) are skipped.
//!
//! Tied embeddings: when `tie_word_embeddings` is set, `lm_head` is `embed_tokens` and any
//! `lm_head.weight` in the checkpoint is ignored (as transformers does). When it is not set but the
//! checkpoint has no `lm_head.weight`, `embed_tokens` is used too, with a warning: some exporters
//! drop the head of tied models without setting the flag.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::Linear;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Deserialize;

use crate::model::config::{parse_error, read_file, ModelConfig};
use crate::model::ModelError;

pub struct LayerWeights {
    pub input_layernorm: Tensor,
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub post_attention_layernorm: Tensor,
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
    /// `[head_dim]` RMSNorm weights on each query / key head (Qwen3), else None.
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
}

/// All weights in f32; every `Linear` weight is `[out_features, in_features]` as in PyTorch.
pub struct ModelWeights {
    /// `[vocab_size, hidden_size]`.
    pub embed_tokens: Tensor,
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm weight, `[hidden_size]`.
    pub norm: Tensor,
    /// `[vocab_size, hidden_size]`; shares `embed_tokens`' storage when `lm_head_tied`.
    pub lm_head: Linear,
    pub lm_head_tied: bool,
}

/// One tensor the model reads, with its expected shape.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

pub(crate) const LM_HEAD: &str = "lm_head.weight";
pub(crate) const EMBED: &str = "model.embed_tokens.weight";

/// Every tensor name and shape the model needs, `lm_head.weight` included when untied.
pub fn expected_tensors(config: &ModelConfig) -> Vec<TensorSpec> {
    let (h, i, v) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    let (q, kv) = (config.q_dim(), config.kv_dim());
    let mut specs = vec![];
    let mut add = |name: String, shape: Vec<usize>| specs.push(TensorSpec { name, shape });
    add(EMBED.into(), vec![v, h]);
    for l in 0..config.num_hidden_layers {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![h]);
        add(format!("{p}.post_attention_layernorm.weight"), vec![h]);
        let (ab, ob, mb) = (config.qkv_bias, config.o_bias, config.mlp_bias);
        let linears: &[(&str, usize, usize, bool)] = if config.architecture.fused_checkpoint() {
            // Phi-3: q|k|v and gate|up stored as one matrix each (split at load, `from_tensors`).
            &[
                ("self_attn.qkv_proj", q + 2 * kv, h, ab),
                ("self_attn.o_proj", h, q, ob),
                ("mlp.gate_up_proj", 2 * i, h, mb),
                ("mlp.down_proj", h, i, mb),
            ]
        } else {
            &[
                ("self_attn.q_proj", q, h, ab),
                ("self_attn.k_proj", kv, h, ab),
                ("self_attn.v_proj", kv, h, ab),
                ("self_attn.o_proj", h, q, ob),
                ("mlp.gate_proj", i, h, mb),
                ("mlp.up_proj", i, h, mb),
                ("mlp.down_proj", h, i, mb),
            ]
        };
        for &(name, out, inp, bias) in linears {
            add(format!("{p}.{name}.weight"), vec![out, inp]);
            if bias {
                add(format!("{p}.{name}.bias"), vec![out]);
            }
        }
        if config.qk_norm {
            add(
                format!("{p}.self_attn.q_norm.weight"),
                vec![config.head_dim],
            );
            add(
                format!("{p}.self_attn.k_norm.weight"),
                vec![config.head_dim],
            );
        }
    }
    add("model.norm.weight".into(), vec![h]);
    if !config.tie_word_embeddings {
        add(LM_HEAD.into(), vec![v, h]);
    }
    specs
}

#[derive(Deserialize)]
struct SafetensorsIndex {
    weight_map: HashMap<String, String>,
}

/// Where each tensor lives: the single file, or the shard the index names.
struct Checkpoint {
    files: Vec<PathBuf>,
    /// Tensor name → shard; `None` for an unsharded checkpoint.
    index: Option<(PathBuf, HashMap<String, PathBuf>)>,
}

impl Checkpoint {
    fn open(dir: &Path) -> Result<Self, ModelError> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        if single.is_file() {
            return Ok(Checkpoint {
                files: vec![single],
                index: None,
            });
        }
        if !index_path.is_file() {
            return Err(ModelError::MissingFile { path: single });
        }
        let index: SafetensorsIndex = serde_json::from_str(&read_file(&index_path)?)
            .map_err(|e| parse_error(&index_path, e))?;
        let shards: BTreeSet<&String> = index.weight_map.values().collect();
        let files: Vec<PathBuf> = shards.into_iter().map(|f| dir.join(f)).collect();
        if let Some(missing) = files.iter().find(|f| !f.is_file()) {
            return Err(ModelError::MissingFile {
                path: missing.clone(),
            });
        }
        let map = index
            .weight_map
            .into_iter()
            .map(|(k, f)| (k, dir.join(f)))
            .collect();
        Ok(Checkpoint {
            files,
            index: Some((index_path, map)),
        })
    }

    /// The file a missing tensor should have been in, for the error message.
    fn location_of(&self, name: &str) -> PathBuf {
        match &self.index {
            None => self.files[0].clone(),
            Some((index_path, map)) => map.get(name).cloned().unwrap_or_else(|| index_path.clone()),
        }
    }
}

/// Loads the weights of `dir` as f32; `progress` draws a bar on stderr while tensors load.
pub fn load_weights(
    dir: &Path,
    config: &ModelConfig,
    progress: bool,
) -> Result<ModelWeights, ModelError> {
    let mut tensors = HashMap::new();
    for_each_tensor(dir, config, progress, |name, raw| {
        let t = raw.to_dtype(DType::F32).map_err(|e| ModelError::Tensor {
            name: name.to_owned(),
            reason: e,
        })?;
        tensors.insert(name.to_owned(), t);
        Ok::<_, ModelError>(())
    })?;
    ModelWeights::from_tensors(config, tensors)
}

/// Reads every tensor the model needs from the checkpoint in `dir`, one shard in memory at a
/// time, checks its shape and dtype (bf16, f16 or f32), and hands it to `f` as stored. Returns
/// whether `lm_head` is tied to the embeddings: by the config, or because an untied config's
/// checkpoint has none (with a warning). A missing tensor is an error after the last shard.
pub(crate) fn for_each_tensor<E: From<ModelError>>(
    dir: &Path,
    config: &ModelConfig,
    progress: bool,
    mut f: impl FnMut(&str, Tensor) -> Result<(), E>,
) -> Result<bool, E> {
    let checkpoint = Checkpoint::open(dir)?;
    let mut wanted: HashMap<String, Vec<usize>> = expected_tensors(config)
        .into_iter()
        .map(|s| (s.name, s.shape))
        .collect();
    let bar = if progress {
        let bar =
            ProgressBar::with_draw_target(Some(wanted.len() as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("loading weights {bar:40} {pos}/{len} tensors {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    for file in &checkpoint.files {
        let bytes = std::fs::read(file).map_err(|e| ModelError::Io {
            path: file.clone(),
            reason: e,
        })?;
        let st = candle_core::safetensors::SliceSafetensors::new(&bytes).map_err(|e| {
            ModelError::Parse {
                path: file.clone(),
                message: e.to_string(),
            }
        })?;
        for (name, view) in st.tensors() {
            let Some(shape) = wanted.remove(&name) else {
                continue;
            };
            if view.shape() != shape.as_slice() {
                return Err(ModelError::ShapeMismatch {
                    name,
                    expected: shape,
                    actual: view.shape().to_vec(),
                }
                .into());
            }
            let raw = st
                .load(&name, &Device::Cpu)
                .map_err(|e| ModelError::Tensor {
                    name: name.clone(),
                    reason: e,
                })?;
            if !matches!(raw.dtype(), DType::BF16 | DType::F16 | DType::F32) {
                return Err(ModelError::unsupported(
                    format!("dtype of tensor {name}"),
                    format!("{:?}", raw.dtype()),
                )
                .into());
            }
            f(&name, raw)?;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let head_missing = wanted.remove(LM_HEAD).is_some();
    if head_missing {
        tracing::warn!(
            "{} has no {LM_HEAD} and tie_word_embeddings is false; using the embeddings as lm_head",
            dir.display()
        );
    }
    if let Some(name) = wanted.keys().min() {
        return Err(ModelError::MissingTensor {
            name: name.clone(),
            path: checkpoint.location_of(name),
        }
        .into());
    }
    Ok(config.tie_word_embeddings || head_missing)
}

impl ModelWeights {
    /// Builds the weights from f32 tensors keyed by their Hugging Face names (what a checkpoint
    /// holds), checking every shape. `lm_head.weight` is used only when the config is untied; when
    /// absent the head is tied to the embeddings.
    pub fn from_tensors(
        config: &ModelConfig,
        mut tensors: HashMap<String, Tensor>,
    ) -> Result<Self, ModelError> {
        let specs: HashMap<String, Vec<usize>> = expected_tensors(config)
            .into_iter()
            .map(|s| (s.name, s.shape))
            .collect();
        let has_head = !config.tie_word_embeddings && tensors.contains_key(LM_HEAD);
        let mut take = |name: String| -> Result<Tensor, ModelError> {
            let t = tensors
                .remove(&name)
                .ok_or_else(|| ModelError::MissingTensor {
                    name: name.clone(),
                    path: PathBuf::from("<tensors>"),
                })?;
            let expected = &specs[&name];
            if t.dims() != expected.as_slice() {
                return Err(ModelError::ShapeMismatch {
                    name,
                    expected: expected.clone(),
                    actual: t.dims().to_vec(),
                });
            }
            if t.dtype() != DType::F32 {
                return Err(ModelError::unsupported(
                    format!("in-memory dtype of tensor {name}"),
                    format!("{:?}", t.dtype()),
                ));
            }
            Ok(t)
        };
        let embed_tokens = take(EMBED.into())?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut linear = |name: &str, bias: bool| -> Result<Linear, ModelError> {
                let w = take(format!("{p}.{name}.weight"))?;
                let b = if bias {
                    Some(take(format!("{p}.{name}.bias"))?)
                } else {
                    None
                };
                Ok(Linear::new(w, b))
            };
            let (ab, ob, mb) = (config.qkv_bias, config.o_bias, config.mlp_bias);
            let (q_proj, k_proj, v_proj, gate_proj, up_proj) =
                if config.architecture.fused_checkpoint() {
                    let (q, kv, i) = (config.q_dim(), config.kv_dim(), config.intermediate_size);
                    let qkv = linear("self_attn.qkv_proj", ab)?;
                    let gate_up = linear("mlp.gate_up_proj", mb)?;
                    let [q_proj, k_proj, v_proj] =
                        split_rows(&qkv, [(0, q), (q, kv), (q + kv, kv)])?;
                    let [gate_proj, up_proj] = split_rows(&gate_up, [(0, i), (i, i)])?;
                    (q_proj, k_proj, v_proj, gate_proj, up_proj)
                } else {
                    (
                        linear("self_attn.q_proj", ab)?,
                        linear("self_attn.k_proj", ab)?,
                        linear("self_attn.v_proj", ab)?,
                        linear("mlp.gate_proj", mb)?,
                        linear("mlp.up_proj", mb)?,
                    )
                };
            let o_proj = linear("self_attn.o_proj", ob)?;
            let down_proj = linear("mlp.down_proj", mb)?;
            let (q_norm, k_norm) = if config.qk_norm {
                (
                    Some(take(format!("{p}.self_attn.q_norm.weight"))?),
                    Some(take(format!("{p}.self_attn.k_norm.weight"))?),
                )
            } else {
                (None, None)
            };
            layers.push(LayerWeights {
                input_layernorm: take(format!("{p}.input_layernorm.weight"))?,
                q_proj,
                k_proj,
                v_proj,
                o_proj,
                post_attention_layernorm: take(format!("{p}.post_attention_layernorm.weight"))?,
                gate_proj,
                up_proj,
                down_proj,
                q_norm,
                k_norm,
            });
        }
        let norm = take("model.norm.weight".into())?;
        let (lm_head, lm_head_tied) = if has_head {
            (Linear::new(take(LM_HEAD.into())?, None), false)
        } else {
            (Linear::new(embed_tokens.clone(), None), true)
        };
        Ok(ModelWeights {
            embed_tokens,
            layers,
            norm,
            lm_head,
            lm_head_tied,
        })
    }
}

/// Row ranges `(first, count)` of a fused linear layer as layers of their own (bias split alike).
fn split_rows<const N: usize>(
    fused: &Linear,
    ranges: [(usize, usize); N],
) -> Result<[Linear; N], ModelError> {
    let part = |(start, len): (usize, usize)| -> candle_core::Result<Linear> {
        let w = fused.weight().narrow(0, start, len)?.contiguous()?;
        let b = match fused.bias() {
            Some(b) => Some(b.narrow(0, start, len)?.contiguous()?),
            None => None,
        };
        Ok(Linear::new(w, b))
    };
    let parts = ranges
        .into_iter()
        .map(part)
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(|e| ModelError::Tensor {
            name: "fused projection".into(),
            reason: e,
        })?;
    Ok(parts
        .try_into()
        .unwrap_or_else(|_| unreachable!("N ranges give N parts")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::WeightDType;
    use crate::model::testing::{write_test_model, TestModelSpec};

    fn write(spec: &TestModelSpec) -> (tempfile::TempDir, ModelConfig) {
        let dir = tempfile::tempdir().unwrap();
        write_test_model(dir.path(), spec).unwrap();
        let config = ModelConfig::from_dir(dir.path()).unwrap();
        (dir, config)
    }

    fn load(spec: &TestModelSpec) -> ModelWeights {
        let (dir, config) = write(spec);
        load_weights(dir.path(), &config, false).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// Every tensor of `a` within `rel` (relative, plus a subnormal floor) of `b`'s.
    fn assert_close(a: &ModelWeights, b: &ModelWeights, rel: f32) {
        let pairs = [
            (&a.embed_tokens, &b.embed_tokens),
            (&a.norm, &b.norm),
            (a.lm_head.weight(), b.lm_head.weight()),
        ];
        let layer_pairs = a.layers.iter().zip(&b.layers).flat_map(|(x, y)| {
            [
                (x.q_proj.weight(), y.q_proj.weight()),
                (x.k_proj.weight(), y.k_proj.weight()),
                (x.o_proj.weight(), y.o_proj.weight()),
                (x.down_proj.weight(), y.down_proj.weight()),
                (&x.post_attention_layernorm, &y.post_attention_layernorm),
            ]
        });
        for (x, y) in pairs.into_iter().chain(layer_pairs) {
            for (p, q) in values(x).iter().zip(values(y)) {
                assert!((p - q).abs() <= rel * q.abs() + 1e-7, "{p} vs {q}");
            }
        }
    }

    #[test]
    fn bf16_f16_and_f32_checkpoints_load_to_the_same_values() {
        let f32w = load(&TestModelSpec::default().dtype(WeightDType::F32));
        let f16w = load(&TestModelSpec::default().dtype(WeightDType::F16));
        let bf16w = load(&TestModelSpec::default().dtype(WeightDType::BF16));
        // Half an ulp of each format's 11 and 8 significant bits.
        assert_close(&f16w, &f32w, 1.0 / 2048.0);
        assert_close(&bf16w, &f32w, 1.0 / 256.0);
        assert_eq!(f32w.embed_tokens.dtype(), DType::F32);
        assert_eq!(bf16w.layers[1].gate_proj.weight().dtype(), DType::F32);
    }

    #[test]
    fn sharded_checkpoint_loads_the_same_weights() {
        let (dir, config) = write(&TestModelSpec::default().shards(3));
        assert!(!dir.path().join("model.safetensors").exists());
        assert!(dir.path().join("model-00003-of-00003.safetensors").exists());
        let sharded = load_weights(dir.path(), &config, false).unwrap();
        assert_close(&sharded, &load(&TestModelSpec::default()), 0.0);
    }

    #[test]
    fn tied_embeddings_share_lm_head_and_untied_do_not() {
        let (dir, config) = write(&TestModelSpec::default().tied(true));
        let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let st = candle_core::safetensors::SliceSafetensors::new(&bytes).unwrap();
        assert!(
            st.get(LM_HEAD).is_err(),
            "a tied checkpoint carries no lm_head"
        );
        let tied = load_weights(dir.path(), &config, false).unwrap();
        assert!(tied.lm_head_tied);
        assert_eq!(values(tied.lm_head.weight()), values(&tied.embed_tokens));
        let untied = load(&TestModelSpec::default());
        assert!(!untied.lm_head_tied);
        assert_ne!(
            values(untied.lm_head.weight()),
            values(&untied.embed_tokens)
        );
    }

    #[test]
    fn untied_config_without_lm_head_falls_back_to_the_embeddings() {
        let (dir, _) = write(&TestModelSpec::default().tied(true));
        let path = dir.path().join("config.json");
        let json = std::fs::read_to_string(&path).unwrap().replace(
            "\"tie_word_embeddings\": true",
            "\"tie_word_embeddings\": false",
        );
        std::fs::write(&path, json).unwrap();
        let config = ModelConfig::from_dir(dir.path()).unwrap();
        assert!(!config.tie_word_embeddings);
        assert!(
            load_weights(dir.path(), &config, false)
                .unwrap()
                .lm_head_tied
        );
    }

    #[test]
    fn missing_tensor_is_named_with_its_file() {
        let (dir, config) = write(&TestModelSpec::default());
        let file = dir.path().join("model.safetensors");
        let mut tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
        let name = "model.layers.1.self_attn.v_proj.weight";
        tensors.remove(name).unwrap();
        candle_core::safetensors::save(&tensors, &file).unwrap();
        let err = load_weights(dir.path(), &config, false).err().unwrap();
        assert!(
            matches!(&err, ModelError::MissingTensor { name: n, path } if n == name && path == &file),
            "{err}"
        );
    }

    #[test]
    fn shape_mismatch_names_tensor_and_shapes() {
        let (dir, mut config) = write(&TestModelSpec::default());
        config.intermediate_size += 8;
        let err = load_weights(dir.path(), &config, false).err().unwrap();
        match &err {
            ModelError::ShapeMismatch {
                name,
                expected,
                actual,
            } => {
                assert!(name.contains(".mlp."), "{name}");
                assert!(expected.contains(&168) && actual.contains(&160), "{err}");
            }
            other => panic!("expected a shape mismatch, got {other}"),
        }
    }

    #[test]
    fn missing_weights_file_or_shard_is_named() {
        let (dir, config) = write(&TestModelSpec::default());
        std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
        let err = load_weights(dir.path(), &config, false).err().unwrap();
        assert!(
            matches!(&err, ModelError::MissingFile { path } if path.ends_with("model.safetensors")),
            "{err}"
        );
        let (dir, config) = write(&TestModelSpec::default().shards(2));
        let shard = dir.path().join("model-00002-of-00002.safetensors");
        std::fs::remove_file(&shard).unwrap();
        let err = load_weights(dir.path(), &config, false).err().unwrap();
        assert!(
            matches!(&err, ModelError::MissingFile { path } if path == &shard),
            "{err}"
        );
    }
}

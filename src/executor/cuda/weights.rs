//! Model weights on the GPU in bf16: streamed from a checkpoint tensor by tensor, uploaded from
//! f32 weights in memory (tests), or generated on the GPU for synthetic benchmarks. q/k/v and
//! gate/up are fused into one matrix each (rows appended in that order), so a layer runs 4 GEMMs
//! instead of 7. With `--quantization fp8` the four linear matrices of each layer are then
//! quantized on the GPU to e4m3 with one scale each (`GpuWeights::quantize_fp8`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Tensor};
use half::bf16;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::device::{DevBuf, Gpu};
use super::fp8_gemm::E4m3Quantizer;
use super::gemm::Weight;
use super::kernels::{self, FillParams};
use crate::model::config::ModelConfig;
use crate::model::fused::{self, Fused};
use crate::model::loader::ModelWeights;

/// A linear layer's `[rows, cols]` weight: bf16, or e4m3 with one f32 scale.
pub struct Linear {
    pub w: DevBuf,
    /// `[2]` f32 when `w` is e4m3: the scale (w ≈ e4m3 value · scale) and its inverse.
    pub scale: Option<DevBuf>,
    pub rows: usize,
    pub cols: usize,
}

impl Linear {
    fn bf16(w: DevBuf, rows: usize, cols: usize) -> Self {
        debug_assert_eq!(w.bytes(), rows * cols * 2);
        Linear {
            w,
            scale: None,
            rows,
            cols,
        }
    }

    /// What `gemm::linear` takes.
    pub fn weight(&self) -> Weight {
        Weight {
            ptr: self.w.ptr(),
            scale: self.scale.as_ref().map_or(0, DevBuf::ptr),
        }
    }

    pub fn bytes(&self) -> usize {
        self.w.bytes() + self.scale.as_ref().map_or(0, DevBuf::bytes)
    }

    /// Replaces the bf16 weight by its e4m3 values and their scale; the bf16 buffer is freed
    /// once the kernels have read it (stream order).
    fn quantize_fp8(&mut self, gpu: &Gpu, quant: &E4m3Quantizer) -> anyhow::Result<()> {
        if self.scale.is_some() {
            return Ok(());
        }
        let q = gpu.alloc(self.rows * self.cols)?;
        let s = gpu.alloc(2 * 4)?;
        // SAFETY: w holds rows x cols bf16, q as many bytes, s two floats.
        unsafe { quant.run(gpu, (self.w.ptr(), q.ptr(), s.ptr()), self.rows * self.cols)? };
        self.w = q;
        self.scale = Some(s);
        Ok(())
    }
}

pub struct LayerWeights {
    /// [hidden]
    pub input_norm: DevBuf,
    /// [(heads + 2 * kv_heads) * head_dim, hidden]
    pub qkv: Linear,
    /// [hidden, heads * head_dim]
    pub o: Linear,
    /// [hidden]
    pub post_norm: DevBuf,
    /// [2 * intermediate, hidden]
    pub gate_up: Linear,
    /// [hidden, intermediate]
    pub down: Linear,
    /// [(heads + 2 * kv_heads) * head_dim]: q, k, v biases (Qwen2).
    pub qkv_bias: Option<DevBuf>,
    /// [head_dim] each: RMSNorm weights of the q and k heads (Qwen3).
    pub qk_norm: Option<(DevBuf, DevBuf)>,
}

pub struct GpuWeights {
    /// [vocab, hidden]
    pub embed: DevBuf,
    pub layers: Vec<LayerWeights>,
    /// [hidden]
    pub norm: DevBuf,
    /// [vocab, hidden]; None: tied to `embed`.
    pub lm_head: Option<DevBuf>,
}

impl GpuWeights {
    pub fn lm_head_ptr(&self) -> u64 {
        self.lm_head.as_ref().unwrap_or(&self.embed).ptr()
    }

    /// Whether the layers' linear weights are e4m3 (`quantize_fp8`).
    pub fn fp8(&self) -> bool {
        self.layers.first().is_some_and(|l| l.qkv.scale.is_some())
    }

    /// `--quantization fp8`: every layer's q/k/v, o, gate/up and down weights to e4m3 with one
    /// scale each (per tensor, as vLLM's dynamic fp8), on the GPU, one matrix at a time (so the
    /// peak is the bf16 model plus one matrix in e4m3). The embedding, norms and LM head stay
    /// bf16. Needs sm_89+ (`quant` checked it).
    pub fn quantize_fp8(&mut self, gpu: &Gpu, quant: &E4m3Quantizer) -> anyhow::Result<()> {
        for l in &mut self.layers {
            for lin in [&mut l.qkv, &mut l.o, &mut l.gate_up, &mut l.down] {
                anyhow::ensure!(
                    lin.cols % 16 == 0 && lin.rows % 8 == 0,
                    "--quantization fp8 needs linear layers of inner size % 16 == 0 and outputs % 8 == 0; got {} x {}",
                    lin.rows,
                    lin.cols
                );
                lin.quantize_fp8(gpu, quant)?;
            }
        }
        gpu.sync()
    }

    pub fn bytes(&self) -> usize {
        let layer = |l: &LayerWeights| {
            l.input_norm.bytes()
                + l.qkv.bytes()
                + l.o.bytes()
                + l.post_norm.bytes()
                + l.gate_up.bytes()
                + l.down.bytes()
                + l.qkv_bias.as_ref().map_or(0, DevBuf::bytes)
                + l.qk_norm.as_ref().map_or(0, |(q, k)| q.bytes() + k.bytes())
        };
        self.embed.bytes()
            + self.norm.bytes()
            + self.lm_head.as_ref().map_or(0, DevBuf::bytes)
            + self.layers.iter().map(layer).sum::<usize>()
    }

    /// Reads the checkpoint in `dir` as bf16 (f16 and f32 tensors converted one at a time) and
    /// uploads each tensor straight into its rows of the fused matrices, so the host never holds
    /// the model in f32, nor more than one shard's bytes and one tensor in bf16.
    pub fn load(
        gpu: &Gpu,
        cfg: &ModelConfig,
        dir: &Path,
        progress: bool,
    ) -> anyhow::Result<GpuWeights> {
        let mut one = Self::load_split(std::slice::from_ref(gpu), cfg, dir, progress)?;
        Ok(one.remove(0))
    }

    /// `load` for tensor parallelism: rank r's shard (`shard::shard_config`'s shapes, its
    /// vocabulary rows of the embedding and LM head) onto `gpus[r]`, each checkpoint tensor cut
    /// into the ranks' parts as it streams (`fused::load_bf16`).
    pub fn load_split(
        gpus: &[Gpu],
        cfg: &ModelConfig,
        dir: &Path,
        progress: bool,
    ) -> anyhow::Result<Vec<GpuWeights>> {
        let world = gpus.len();
        let untied = !cfg.tie_word_embeddings;
        let tensors = Fused::all(cfg, untied);
        // Every rank's bytes (replicated norms and KV heads counted on each rank).
        let total: usize = tensors.iter().map(|t| t.split_len(cfg, world) * 2).sum();
        let bar = progress_bar(
            progress,
            (total * world) as u64,
            "loading weights to the GPU (bf16)",
        );
        let mut bufs: Vec<HashMap<Fused, DevBuf>> = Vec::with_capacity(world);
        for gpu in gpus {
            let mut rank = HashMap::new();
            for &t in &tensors {
                rank.insert(t, gpu.alloc(t.split_len(cfg, world) * 2)?);
            }
            bufs.push(rank);
        }
        let tied = fused::load_bf16(dir, cfg, world, false, |rank, t, offset, values| {
            let buf = bufs[rank]
                .get(&t)
                .with_context(|| format!("no buffer for {t:?}"))?;
            gpus[rank].upload(buf.at::<bf16>(offset), values)?;
            bar.inc(values.len() as u64 * 2);
            Ok(())
        })?;
        for gpu in gpus {
            gpu.sync()?;
        }
        bar.finish_and_clear();
        let rank_cfg = crate::model::shard::shard_config(cfg, world);
        Ok(bufs
            .into_iter()
            .map(|bufs| Self::assemble(&rank_cfg, bufs, tied))
            .collect())
    }

    /// The weights from their fused buffers (`load_split`'s, every one of `cfg`'s layout).
    fn assemble(cfg: &ModelConfig, mut bufs: HashMap<Fused, DevBuf>, tied: bool) -> GpuWeights {
        let mut take = |t: Fused| bufs.remove(&t).expect("every fused tensor is allocated");
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let qkv_rows = cfg.q_dim() + 2 * cfg.kv_dim();
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| LayerWeights {
                input_norm: take(Fused::InputNorm(l)),
                qkv: Linear::bf16(take(Fused::Qkv(l)), qkv_rows, h),
                o: Linear::bf16(take(Fused::O(l)), h, cfg.q_dim()),
                post_norm: take(Fused::PostNorm(l)),
                gate_up: Linear::bf16(take(Fused::GateUp(l)), 2 * i, h),
                down: Linear::bf16(take(Fused::Down(l)), h, i),
                qkv_bias: cfg.qkv_bias.then(|| take(Fused::QkvBias(l))),
                qk_norm: cfg
                    .qk_norm
                    .then(|| (take(Fused::QNorm(l)), take(Fused::KNorm(l)))),
            })
            .collect();
        GpuWeights {
            embed: take(Fused::Embed),
            layers,
            norm: take(Fused::Norm),
            // An untied config whose checkpoint has no head: its buffer is dropped here.
            lm_head: bufs.remove(&Fused::LmHead).filter(|_| !tied),
        }
    }

    /// Uploads f32 checkpoint weights as bf16, with a progress bar over bytes when `progress`.
    pub fn upload(
        gpu: &Gpu,
        cfg: &ModelConfig,
        w: &ModelWeights,
        progress: bool,
    ) -> anyhow::Result<GpuWeights> {
        let total = param_bytes(cfg, !w.lm_head_tied);
        let bar = progress_bar(
            progress,
            total as u64,
            "uploading weights to the GPU (bf16)",
        );
        let up = |parts: &[&Tensor]| -> anyhow::Result<DevBuf> {
            let n: usize = parts.iter().map(|t| t.elem_count()).sum();
            let buf = gpu.alloc(n * 2)?;
            let mut off = 0;
            for t in parts {
                let host: Vec<bf16> = t.to_dtype(DType::BF16)?.flatten_all()?.to_vec1::<bf16>()?;
                gpu.upload(buf.at::<bf16>(off), &host)?;
                off += host.len();
                bar.inc(host.len() as u64 * 2);
            }
            Ok(buf)
        };
        anyhow::ensure!(
            !cfg.o_bias && !cfg.mlp_bias,
            "the CUDA executor has no o-projection or MLP biases"
        );
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let qkv_rows = cfg.q_dim() + 2 * cfg.kv_dim();
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            layers.push(
                (|| -> anyhow::Result<LayerWeights> {
                    let qkv_bias = match (l.q_proj.bias(), l.k_proj.bias(), l.v_proj.bias()) {
                        (Some(q), Some(k), Some(v)) => Some(up(&[q, k, v])?),
                        _ => None,
                    };
                    let qk_norm = match (&l.q_norm, &l.k_norm) {
                        (Some(q), Some(k)) => Some((up(&[q])?, up(&[k])?)),
                        _ => None,
                    };
                    Ok(LayerWeights {
                        input_norm: up(&[&l.input_layernorm])?,
                        qkv: Linear::bf16(
                            up(&[l.q_proj.weight(), l.k_proj.weight(), l.v_proj.weight()])?,
                            qkv_rows,
                            h,
                        ),
                        o: Linear::bf16(up(&[l.o_proj.weight()])?, h, cfg.q_dim()),
                        post_norm: up(&[&l.post_attention_layernorm])?,
                        gate_up: Linear::bf16(
                            up(&[l.gate_proj.weight(), l.up_proj.weight()])?,
                            2 * inter,
                            h,
                        ),
                        down: Linear::bf16(up(&[l.down_proj.weight()])?, h, inter),
                        qkv_bias,
                        qk_norm,
                    })
                })()
                .with_context(|| format!("uploading layer {i}"))?,
            );
        }
        let out = GpuWeights {
            embed: up(&[&w.embed_tokens])?,
            layers,
            norm: up(&[&w.norm])?,
            lm_head: if w.lm_head_tied {
                None
            } else {
                Some(up(&[w.lm_head.weight()])?)
            },
        };
        gpu.sync()?;
        bar.finish_and_clear();
        Ok(out)
    }

    /// Random weights generated on the GPU (uniform, std 0.02 like common inits; norms 1), for
    /// benchmarks of a model's shapes without its checkpoint.
    pub fn random(gpu: &Gpu, cfg: &ModelConfig, seed: u64) -> anyhow::Result<GpuWeights> {
        let mut next_seed = seed;
        let mut fill = |n: usize, scale: f32, offset: f32| -> anyhow::Result<DevBuf> {
            let buf = gpu.alloc(n * 2)?;
            next_seed = next_seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let p = FillParams {
                out: buf.ptr(),
                n: n as u64,
                seed: next_seed,
                scale,
                offset,
            };
            // SAFETY: `buf` holds n bf16.
            unsafe { kernels::fill_uniform(gpu, &p)? };
            Ok(buf)
        };
        // Uniform(-a, a) has std a / sqrt(3).
        let a = 0.02 * 3f32.sqrt();
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let qkv_rows = cfg.q_dim() + 2 * cfg.kv_dim();
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            layers.push(LayerWeights {
                input_norm: fill(h, 0.0, 1.0)?,
                qkv: Linear::bf16(fill(qkv_rows * h, a, 0.0)?, qkv_rows, h),
                o: Linear::bf16(fill(h * cfg.q_dim(), a, 0.0)?, h, cfg.q_dim()),
                post_norm: fill(h, 0.0, 1.0)?,
                gate_up: Linear::bf16(fill(2 * i * h, a, 0.0)?, 2 * i, h),
                down: Linear::bf16(fill(h * i, a, 0.0)?, h, i),
                qkv_bias: match cfg.qkv_bias {
                    true => Some(fill(qkv_rows, a, 0.0)?),
                    false => None,
                },
                qk_norm: match cfg.qk_norm {
                    true => Some((fill(cfg.head_dim, 0.0, 1.0)?, fill(cfg.head_dim, 0.0, 1.0)?)),
                    false => None,
                },
            });
        }
        let out = GpuWeights {
            embed: fill(cfg.vocab_size * h, 1.0, 0.0)?,
            layers,
            norm: fill(h, 0.0, 1.0)?,
            lm_head: if cfg.tie_word_embeddings {
                None
            } else {
                Some(fill(cfg.vocab_size * h, a, 0.0)?)
            },
        };
        gpu.sync()?;
        Ok(out)
    }
}

/// Bytes of the bf16 weights of `cfg`.
pub fn param_bytes(cfg: &ModelConfig, untied_head: bool) -> usize {
    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let qkv = cfg.q_dim() + 2 * cfg.kv_dim();
    let layer = 2 * h
        + qkv * h
        + h * cfg.q_dim()
        + 3 * i * h
        + usize::from(cfg.qkv_bias) * qkv
        + usize::from(cfg.qk_norm) * 2 * cfg.head_dim;
    2 * (v * h * (1 + usize::from(untied_head)) + h + cfg.num_hidden_layers * layer)
}

fn progress_bar(show: bool, total: u64, what: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{bytes}}/{{total_bytes}} {{elapsed}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

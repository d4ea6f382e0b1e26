//! The Llama-family forward (every `model::arch` family: biases, Qwen3's q/k norms, sliding
//! windows, longrope) over one flattened, paged batch (see `step::batch`): the path the CPU
//! executor runs every engine step.
//!
//! Projections and the MLP are f32 matmuls over all of the batch's tokens at once
//! (`[num_tokens, hidden] × Wᵀ`, `model::cpu_ops`), whatever mix of prefill chunks and decodes
//! they come from: a few rows (decodes, a verification's k + 1) stream each weight once, so
//! verifying k drafts costs about what one decode row does.
//! Attention is plain Rust, parallel over (token, head) with rayon: each query token attends to
//! positions `0..=its position` of its own sequence, reading K/V through the sequence's block
//! table. That covers the prefix cached by earlier steps and this step's own chunk alike, because
//! the chunk's K/V is written into the pool (at `slot_mapping`) before attention reads it. Under a
//! sliding window a token attends to its last `window` positions only; the blocks before them
//! may have been freed (`step::NULL_BLOCK` in the table) and are never read.
//!
//! q/k/v and gate/up are fused into one weight each at load (as vLLM does), so a layer runs four
//! GEMMs: qkv, o, gate_up, down.
//!
//! A tensor-parallel rank (`new_rank`) runs its shard (`model::shard`) through the same forward:
//! its embedding slice and o/down products are all-reduced, its logits slice all-gathered.

use candle_core::Tensor;
use candle_nn::Linear;
use rayon::prelude::*;

use crate::model::config::ModelConfig;
use crate::model::cpu_attention::{paged_attention, AttentionPlan};
use crate::model::cpu_ops::{add_assign, dot, rms_norm, swiglu, to_vec, Dense};
use crate::model::loader::ModelWeights;
use crate::parallel::Communicator;
use crate::step::BatchInput;

/// The paged KV cache: for each layer, K and V as flat f32 arrays laid out
/// `[num_blocks, block_size, num_kv_heads, head_dim]`, i.e. `[slot, kv_head, head_dim]` with
/// `slot = block_id * block_size + offset`. One token's K (or V) for all heads is one contiguous
/// run of `num_kv_heads * head_dim` floats, so a write is one copy and a head's key is contiguous.
///
/// Every slot starts as NaN: attention that reads a slot no step has written produces NaN logits
/// instead of plausible garbage, so a block-table or slot-mapping bug cannot go unnoticed. Filling
/// also commits the pool's memory at start-up rather than at some later step.
pub struct KvPool {
    num_blocks: usize,
    block_size: usize,
    /// `num_kv_heads * head_dim`: floats per slot.
    kv_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvPool {
    pub fn new(config: &ModelConfig, num_blocks: usize, block_size: usize) -> Self {
        let kv_dim = config.kv_dim();
        let per_layer = num_blocks * block_size * kv_dim;
        let layers = config.num_hidden_layers;
        KvPool {
            num_blocks,
            block_size,
            kv_dim,
            k: (0..layers).map(|_| vec![f32::NAN; per_layer]).collect(),
            v: (0..layers).map(|_| vec![f32::NAN; per_layer]).collect(),
        }
    }

    /// Bytes of one block across all layers, K and V, in f32.
    pub fn bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
        block_size * config.kv_bytes_per_token(std::mem::size_of::<f32>())
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Floats of one block in one layer's K (or V).
    fn block_floats(&self) -> usize {
        self.block_size * self.kv_dim
    }

    /// Copies block `src` of `from` into block `dst` of `to` (another pool of the same model
    /// and block size: the KV host tier), every layer's K and V. Ids are checked by the caller.
    pub fn copy_block_between(from: &KvPool, src: usize, to: &mut KvPool, dst: usize) {
        let n = from.block_floats();
        debug_assert_eq!(n, to.block_floats());
        for (f, t) in from
            .k
            .iter()
            .zip(&mut to.k)
            .chain(from.v.iter().zip(&mut to.v))
        {
            t[dst * n..(dst + 1) * n].copy_from_slice(&f[src * n..(src + 1) * n]);
        }
    }

    /// Copies block `src` into block `dst` of this pool (copy-on-write of a shared block).
    pub fn copy_block_within(&mut self, src: usize, dst: usize) {
        let n = self.block_floats();
        for t in self.k.iter_mut().chain(&mut self.v) {
            t.copy_within(src * n..(src + 1) * n, dst * n);
        }
    }

    /// Block `b`'s floats, every layer's K then every layer's V (tests compare tiers with it).
    pub fn block_data(&self, b: usize) -> Vec<f32> {
        let n = self.block_floats();
        self.k
            .iter()
            .chain(&self.v)
            .flat_map(|t| t[b * n..(b + 1) * n].iter().copied())
            .collect()
    }

    /// Overwrites block `b` with `data` (laid out as `block_data`'s).
    pub fn set_block_data(&mut self, b: usize, data: &[f32]) {
        let n = self.block_floats();
        assert_eq!(data.len(), n * (self.k.len() + self.v.len()));
        for (t, d) in self.k.iter_mut().chain(&mut self.v).zip(data.chunks(n)) {
            t[b * n..(b + 1) * n].copy_from_slice(d);
        }
    }
}

struct LayerParams {
    input_layernorm: Vec<f32>,
    /// q, k and v projections stacked: `[q_dim + 2 * kv_dim, hidden]`.
    qkv_proj: Dense,
    o_proj: Dense,
    post_attention_layernorm: Vec<f32>,
    /// gate and up projections stacked: `[2 * intermediate, hidden]`.
    gate_up_proj: Dense,
    down_proj: Dense,
    /// Qwen3's per-head RMSNorm weights, `[head_dim]` each.
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
}

pub struct LlamaModel {
    /// A tensor-parallel rank's: its shard's (`model::shard::shard_config`).
    config: ModelConfig,
    /// `[vocab, hidden]`; a rank's `[vocab_rows, hidden]` slice.
    embed_tokens: Dense,
    layers: Vec<LayerParams>,
    norm: Vec<f32>,
    /// None: tied to `embed_tokens`.
    lm_head: Option<Dense>,
    /// `cos(pos · inv_freq[i])` and `sin(…)` (times longrope's attention factor),
    /// `[max_position_embeddings, head_dim / 2]`.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    /// Set when this is one rank of a tensor-parallel world (`model::shard`).
    tp: Option<TpRank>,
}

/// A tensor-parallel rank's link to the others: its communicator and its vocabulary slice.
pub struct TpRank {
    pub comm: Box<dyn Communicator>,
    /// The first vocabulary id of this rank's embedding and LM-head rows
    /// (`rank * shard::vocab_rows`).
    pub vocab_start: usize,
}

fn stack(parts: &[&Linear]) -> candle_core::Result<Dense> {
    let weights: Vec<&Tensor> = parts.iter().map(|l| l.weight()).collect();
    let bias = match parts
        .iter()
        .map(|l| l.bias())
        .collect::<Option<Vec<&Tensor>>>()
    {
        Some(biases) => Some(Tensor::cat(&biases, 0)?),
        None => None,
    };
    Dense::from_linear(&Linear::new(Tensor::cat(&weights, 0)?, bias))
}

impl LlamaModel {
    /// Takes the weights over, fusing q/k/v and gate/up layer by layer (so peak memory grows by
    /// one layer, not by the model).
    pub fn new(config: ModelConfig, weights: ModelWeights) -> anyhow::Result<Self> {
        let ModelWeights {
            embed_tokens,
            layers,
            norm,
            lm_head,
            lm_head_tied,
        } = weights;
        let mut fused = Vec::with_capacity(layers.len());
        for l in layers {
            let qk_norm = match (&l.q_norm, &l.k_norm) {
                (Some(q), Some(k)) => Some((q.to_vec1::<f32>()?, k.to_vec1::<f32>()?)),
                _ => None,
            };
            fused.push(LayerParams {
                input_layernorm: to_vec(&l.input_layernorm)?,
                qkv_proj: stack(&[&l.q_proj, &l.k_proj, &l.v_proj])?,
                o_proj: Dense::from_linear(&l.o_proj)?,
                post_attention_layernorm: to_vec(&l.post_attention_layernorm)?,
                gate_up_proj: stack(&[&l.gate_proj, &l.up_proj])?,
                down_proj: Dense::from_linear(&l.down_proj)?,
                qk_norm,
            });
        }
        let half = config.head_dim / 2;
        let inv_freqs = config.rope.inv_freqs(config.head_dim);
        let mscale = config.rope.attention_factor();
        let mut rope_cos = Vec::with_capacity(config.max_position_embeddings * half);
        let mut rope_sin = Vec::with_capacity(config.max_position_embeddings * half);
        for pos in 0..config.max_position_embeddings {
            for &f in &inv_freqs {
                // Angles in f64: at long positions f32 products lose the low bits of the phase.
                let angle = pos as f64 * f;
                rope_cos.push((angle.cos() * mscale) as f32);
                rope_sin.push((angle.sin() * mscale) as f32);
            }
        }
        // A tensor-parallel rank holds a slice of the vocabulary's rows.
        let (rows, hidden) = embed_tokens.dims2()?;
        anyhow::ensure!(
            hidden == config.hidden_size,
            "embed_tokens is not [_, hidden]"
        );
        let embed_tokens = Dense::new(to_vec(&embed_tokens)?, rows, hidden, None);
        let lm_head = match lm_head_tied {
            true => None,
            false => Some(Dense::from_linear(&lm_head)?),
        };
        Ok(LlamaModel {
            config,
            embed_tokens,
            layers: fused,
            norm: to_vec(&norm)?,
            lm_head,
            rope_cos,
            rope_sin,
            tp: None,
        })
    }

    /// One rank of a tensor-parallel world: `config` and `weights` are the rank's shard
    /// (`model::shard`); the forward all-reduces and all-gathers through `tp.comm`.
    pub fn new_rank(
        config: ModelConfig,
        weights: ModelWeights,
        tp: TpRank,
    ) -> anyhow::Result<Self> {
        let mut m = Self::new(config, weights)?;
        m.tp = Some(tp);
        Ok(m)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Sums a row-parallel projection's partial products over the ranks.
    fn all_reduce(&self, x: &mut [f32]) -> anyhow::Result<()> {
        match &self.tp {
            Some(tp) => Ok(tp.comm.all_reduce_sum(x)?),
            None => Ok(()),
        }
    }

    /// The embedding rows of `tokens`: with tensor parallelism each rank looks up the ids in its
    /// vocabulary slice (zeros for the others) and the all-reduce completes every row.
    fn embed(&self, tokens: &[u32], x: &mut Vec<f32>) -> anyhow::Result<()> {
        let hs = self.config.hidden_size;
        let (start, rows) = match &self.tp {
            Some(tp) => (tp.vocab_start, self.embed_tokens.out_features()),
            None => (0, self.config.vocab_size),
        };
        for &t in tokens {
            match (t as usize).checked_sub(start).filter(|&i| i < rows) {
                Some(i) => self.embed_tokens.push_row(i, x),
                None => x.resize(x.len() + hs, 0.0),
            }
        }
        self.all_reduce(x)
    }

    /// The logits of `h`'s `rows` rows, `[rows, vocab]`: with tensor parallelism each rank's
    /// vocabulary slice, gathered and put side by side (the last rank's padding dropped).
    fn logits(&self, h: &[f32], rows: usize) -> anyhow::Result<Vec<f32>> {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let mut local = Vec::new();
        head.forward(h, rows, &mut local);
        let Some(tp) = &self.tp else {
            return Ok(local);
        };
        let mut all = Vec::new();
        tp.comm.all_gather(&local, &mut all)?;
        let (world, width, vocab) = (
            tp.comm.world_size(),
            head.out_features(),
            self.config.vocab_size,
        );
        let mut logits = Vec::with_capacity(rows * vocab);
        for row in 0..rows {
            for rank in 0..world {
                let take = width.min(vocab - (rank * width).min(vocab));
                let at = (rank * rows + row) * width;
                logits.extend_from_slice(&all[at..at + take]);
            }
        }
        Ok(logits)
    }

    /// Runs the batch through the model, writing its K/V into `kv`, and returns the logits at the
    /// last position of each sequence whose `sample` is Some — at its last `num_drafts + 1`
    /// positions when it verifies drafts — `[batch.num_logit_rows(), vocab]` row-major, in seq
    /// order. The batch must be valid (`BatchInput::validate`) for `kv`'s block size and count.
    pub fn forward(&self, batch: &BatchInput, kv: &mut KvPool) -> anyhow::Result<Vec<f32>> {
        self.check_batch(batch)?;
        let c = &self.config;
        let n = batch.num_tokens();
        anyhow::ensure!(
            kv.kv_dim == c.kv_dim() && kv.k.len() == self.layers.len(),
            "KV pool shape does not match the model"
        );
        if n == 0 {
            return Ok(Vec::new());
        }
        let plan = AttentionPlan::new(batch, c.sliding_window.unwrap_or(usize::MAX));
        let hs = c.hidden_size;
        let mut x = Vec::with_capacity(n * hs);
        self.embed(&batch.token_ids, &mut x)?;
        let eps = c.rms_norm_eps as f32;
        let q_dim = c.q_dim();
        // Buffers reused by every layer.
        let [mut h, mut qkv, mut attn, mut proj, mut gate_up, mut act]: [Vec<f32>; 6] =
            Default::default();
        for (layer_idx, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.input_layernorm, eps, &mut h);
            layer.qkv_proj.forward(&h, n, &mut qkv);
            self.rope_and_store(&mut qkv, batch, kv, layer_idx, layer.qk_norm.as_ref());
            attn.clear();
            attn.resize(n * q_dim, 0.0);
            paged_attention(
                &qkv,
                &mut attn,
                (&kv.k[layer_idx], &kv.v[layer_idx]),
                kv.block_size,
                c,
                &plan,
            );
            layer.o_proj.forward(&attn, n, &mut proj);
            self.all_reduce(&mut proj)?;
            add_assign(&mut x, &proj);

            rms_norm(&x, &layer.post_attention_layernorm, eps, &mut h);
            layer.gate_up_proj.forward(&h, n, &mut gate_up);
            swiglu(&gate_up, c.intermediate_size, &mut act);
            layer.down_proj.forward(&act, n, &mut proj);
            self.all_reduce(&mut proj)?;
            add_assign(&mut x, &proj);
        }
        // Prefill chunks that end before their prompt does only fill the cache.
        let mut last = Vec::with_capacity(batch.num_logit_rows() * hs);
        for row in logit_rows(batch) {
            last.extend_from_slice(&x[row * hs..(row + 1) * hs]);
        }
        let rows = last.len() / hs;
        rms_norm(&last, &self.norm, eps, &mut h);
        self.logits(&h, rows)
    }

    /// The forward's checks of a batch's positions and token ids (the rest is
    /// `BatchInput::validate`'s): a tensor-parallel backend runs them before any rank starts, so
    /// a bad batch fails alike everywhere and before any collective.
    pub fn check_batch(&self, batch: &BatchInput) -> anyhow::Result<()> {
        let c = &self.config;
        if let Some(&p) = batch
            .positions
            .iter()
            .find(|&&p| p as usize >= c.max_position_embeddings)
        {
            anyhow::bail!(
                "position {p} exceeds max_position_embeddings {}",
                c.max_position_embeddings
            );
        }
        if let Some(&t) = batch
            .token_ids
            .iter()
            .find(|&&t| t as usize >= c.vocab_size)
        {
            anyhow::bail!("token id {t} is outside the vocabulary of {}", c.vocab_size);
        }
        Ok(())
    }

    /// Normalises each q and k head when the model has q/k norms (Qwen3), rotates the q and k
    /// heads (in the fused `[num_tokens, q | k | v]` rows) by the token's position, then copies k
    /// and v into the pool at the token's slot.
    fn rope_and_store(
        &self,
        qkv: &mut [f32],
        batch: &BatchInput,
        kv: &mut KvPool,
        layer: usize,
        qk_norm: Option<&(Vec<f32>, Vec<f32>)>,
    ) {
        let c = &self.config;
        let (hd, q_dim, kv_dim) = (c.head_dim, c.q_dim(), c.kv_dim());
        let row_len = q_dim + 2 * kv_dim;
        let half = hd / 2;
        let eps = c.rms_norm_eps as f32;
        let rotate = |(row, &pos): (&mut [f32], &u32)| {
            let cos = &self.rope_cos[pos as usize * half..][..half];
            let sin = &self.rope_sin[pos as usize * half..][..half];
            // q heads then k heads: both rotated the same way (transformers' rotate_half layout:
            // pair i is (x[i], x[i + head_dim/2])).
            for (h, head) in row[..q_dim + kv_dim].chunks_exact_mut(hd).enumerate() {
                if let Some((qn, kn)) = qk_norm {
                    let w = if h * hd < q_dim { qn } else { kn };
                    let inv = (dot(head, head) / hd as f32 + eps).sqrt().recip();
                    head.iter_mut().zip(w).for_each(|(x, w)| *x *= inv * w);
                }
                let (x1, x2) = head.split_at_mut(half);
                for i in 0..half {
                    let (a, b) = (x1[i], x2[i]);
                    x1[i] = a * cos[i] - b * sin[i];
                    x2[i] = b * cos[i] + a * sin[i];
                }
            }
        };
        // A fork costs more than rotating a few rows.
        if batch.positions.len() >= PAR_MIN_ROWS {
            qkv.par_chunks_mut(row_len)
                .zip(batch.positions.par_iter())
                .for_each(rotate);
        } else {
            qkv.chunks_mut(row_len)
                .zip(&batch.positions)
                .for_each(rotate);
        }
        let (k_cache, v_cache) = (&mut kv.k[layer], &mut kv.v[layer]);
        for (row, &slot) in qkv.chunks_exact(row_len).zip(&batch.slot_mapping) {
            let dst = slot as usize * kv_dim..(slot as usize + 1) * kv_dim;
            k_cache[dst.clone()].copy_from_slice(&row[q_dim..q_dim + kv_dim]);
            v_cache[dst].copy_from_slice(&row[q_dim + kv_dim..]);
        }
    }
}

/// The rows of the flattened batch whose logits are returned, in order: each sampling
/// sequence's last `num_drafts + 1` rows.
fn logit_rows(batch: &BatchInput) -> impl Iterator<Item = usize> + '_ {
    let mut end = 0usize;
    batch.seqs.iter().flat_map(move |s| {
        end += s.query_len;
        let n = if s.sample.is_some() {
            s.num_drafts + 1
        } else {
            0
        };
        end - n..end
    })
}

/// Rows from which rotary embedding runs in parallel.
const PAR_MIN_ROWS: usize = 64;

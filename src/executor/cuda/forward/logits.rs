//! Logit rows read back on demand: tests compare them with the CPU's, and a draft model's
//! sampled verifications need their target probabilities (`execute` otherwise copies back
//! only tokens).

use super::Forward;

impl Forward {
    /// The fp32 logits of the last launch's `ns` sampled rows; waits for the stream.
    pub fn logits(&self, ns: usize) -> anyhow::Result<Vec<Vec<f32>>> {
        let v = self.cfg.vocab_size;
        let mut flat = vec![0f32; ns * v];
        self.gpu.download(&mut flat, self.act.logits.ptr())?;
        Ok(flat.chunks(v).map(<[f32]>::to_vec).collect())
    }

    /// Appends the fp32 logits of the last launch's sampled rows `ranges` ((first, count)
    /// pairs) to `out`, in order; waits for the stream. Speculative decoding's host
    /// verifications read only their own rows.
    pub fn logit_rows(&self, ranges: &[(usize, usize)], out: &mut Vec<f32>) -> anyhow::Result<()> {
        let v = self.cfg.vocab_size;
        for &(first, n) in ranges {
            anyhow::ensure!(first + n <= self.max_rows, "logit rows {first}+{n}");
            let at = out.len();
            out.resize(at + n * v, 0.0);
            let src = self.act.logits.ptr() + (first * v * 4) as u64;
            self.gpu.download(&mut out[at..], src)?;
        }
        Ok(())
    }
}

//! RoPE inverse frequencies, computed on the host once and uploaded: the rope_kv kernel only
//! multiplies them by the position, so any frequency scaling is free at run time.

/// Llama 3.x frequency scaling (`rope_scaling.rope_type == "llama3"` in HF configs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// inv_freq[i] = theta^(-2i / head_dim), i < head_dim / 2, then llama3 scaling if given
/// (as HF's `_compute_llama3_parameters`: long wavelengths slowed by `factor`, short ones kept,
/// a linear blend between).
pub fn inv_freq(head_dim: usize, theta: f64, llama3: Option<Llama3Scaling>) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let f = theta.powf(-((2 * i) as f64) / head_dim as f64);
            let f = match llama3 {
                None => f,
                Some(s) => {
                    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
                    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / s.factor
                    } else {
                        let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                            / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * f / s.factor + smooth * f
                    }
                }
            };
            f as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama31() -> Llama3Scaling {
        Llama3Scaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192.0 }
    }

    #[test]
    fn plain_frequencies_follow_theta() {
        let f = inv_freq(128, 10000.0, None);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert!((f[1] as f64 - 10000f64.powf(-2.0 / 128.0)).abs() < 1e-7);
    }

    #[test]
    fn llama3_keeps_high_frequencies_and_slows_low_ones() {
        let plain = inv_freq(128, 500000.0, None);
        let scaled = inv_freq(128, 500000.0, Some(llama31()));
        assert_eq!(scaled[0], plain[0]);
        assert!((scaled[63] - plain[63] / 8.0).abs() <= plain[63] * 1e-6);
        // The blended band lies between the two.
        let mid = (0..64).find(|&i| scaled[i] != plain[i] && (scaled[i] - plain[i] / 8.0).abs() > plain[i] * 1e-6);
        let i = mid.expect("some frequency is blended");
        assert!(scaled[i] < plain[i] && scaled[i] > plain[i] / 8.0);
    }
}

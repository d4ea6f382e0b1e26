//! `kv_stage` (kernels/kv_stage.cu): the host tier's blocks gathered into (or scattered out of)
//! a contiguous staging buffer, on the stream the caller names (the tier's copy stream).

use cudarc::driver::CudaStream;

use super::Gpu;

/// Most blocks one `kv_stage` launch moves (`KV_STAGE_MAX_BLOCKS` in kv_stage.cu).
pub const KV_STAGE_MAX_BLOCKS: usize = 64;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvStageParams {
    pub pool: u64,
    pub staging: u64,
    pub plane_stride: i64,
    pub plane_bytes: i64,
    pub planes: i32,
    pub n: i32,
    pub to_staging: i32,
    pub blocks: [i32; KV_STAGE_MAX_BLOCKS],
}

/// # Safety
/// `p.pool` addresses the pool the layout in `p` describes, with every id in `p.blocks[..n]`
/// inside it, and `p.staging` holds `n * planes * plane_bytes` bytes.
pub unsafe fn kv_stage(gpu: &Gpu, stream: &CudaStream, p: &KvStageParams) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=KV_STAGE_MAX_BLOCKS as i32).contains(&p.n)
            && p.planes > 0
            && p.plane_bytes > 0
            && p.plane_bytes % 16 == 0
            && p.plane_stride % 16 == 0,
        "kv_stage: {} blocks of {} planes of {} bytes, stride {}",
        p.n,
        p.planes,
        p.plane_bytes,
        p.plane_stride
    );
    let words = (p.plane_bytes / 16) as u32;
    // Enough CTAs over all (block, plane) pairs to fill the GPU without one per word.
    let pairs = (p.planes * p.n) as u32;
    let x = words
        .div_ceil(256)
        .min((gpu.num_sms * 8).div_ceil(pairs).max(1));
    gpu.launch_on(
        stream,
        "kv_stage",
        (x, p.planes as u32, p.n as u32),
        (256, 1, 1),
        p,
    )
}

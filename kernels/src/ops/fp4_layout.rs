//! FP4 expert weights and scales from the checkpoint's order into the device layouts the expert kernels read
//! (see cuda/common.cuh `fp4_pairs`, `fp4_scale_at` and cuda/fp4_layout.cu). The CPU twins are
//! [`crate::reference::formats::fp4_device_word`] and [`crate::reference::formats::fp4_scales_device_layout`].
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, LaunchConfig};

use super::{int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;
use crate::reference::formats::fp4_tiled;

const NAME: &str = "fp4_to_device_layout";
const SCALES: &str = "fp4_scales_to_device_layout";
const TILES: &str = "fp4_rows_to_tiles";

/// Blocks of 256 threads for a grid-stride pass over `items`: enough to fill the GPU, never more than needed.
fn stride_blocks(items: u64) -> u32 {
    items.div_ceil(256).min(2048) as u32
}

impl GpuContext {
    /// Rewrites `w` (FP4 weights u8 [experts, n, k/2] with k % 32 == 0, as read from a checkpoint) in place
    /// into the device layout: each word's bits (fp4_to_device_layout), then, when
    /// [`fp4_tiled`](crate::reference::formats::fp4_tiled)`(n, k)`, each 32-row band into 2 KB tiles
    /// (fp4_rows_to_tiles). Run exactly once per buffer, before any expert kernel reads it: a second run
    /// permutes again.
    pub fn launch_fp4_to_device_layout(
        &self,
        stream: &CudaStream,
        w: &mut impl DevicePtrMut<u8>,
        experts: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let bytes = experts * n * (k / 2);
        check(NAME, k.is_multiple_of(32) && w.len() >= bytes, || {
            format!(
                "{} bytes for {experts} x [{n}, {k}] (k % 32 == 0, {bytes} bytes)",
                w.len()
            )
        })?;
        if bytes == 0 {
            return Ok(());
        }
        let words = (bytes / 4) as u64;
        let cfg = LaunchConfig {
            grid_dim: (stride_blocks(words), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let p = ptr_mut(w, stream);
        let mut l = Args::new();
        l.arg(&p).arg(&words);
        // SAFETY: fp4_to_device_layout(w, words) reads and writes `words` u32 of w, which holds at least
        // 4 * words bytes (checked above); cudarc allocations are 256-byte aligned and callers pass whole
        // buffers or slices at multiples of 4 bytes.
        unsafe { self.launch_k(stream, &self.kernels.fp4_layout, cfg, &mut l) }?;
        if !fp4_tiled(n, k) {
            return Ok(());
        }
        let bands = (experts * n / 32) as u64;
        let ki = int(TILES, "k", k)?;
        let cfg = LaunchConfig {
            grid_dim: (bands.min(4096) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&p).arg(&bands).arg(&ki);
        // SAFETY: fp4_rows_to_tiles(w, bands, k) rewrites `bands` bands of 16 k bytes = experts * n * k / 2
        // bytes of w (checked above) in 16-byte pieces (16-aligned: k % 128 == 0); k <= FP4_TILE_MAX_K
        // (fp4_tiled), the most one thread's registers hold.
        unsafe { self.launch_k(stream, &self.kernels.fp4_tiles, cfg, &mut l) }?;
        Ok(())
    }

    /// The UE8M0 scales of `experts` FP4 matrices [n, k] (u8 [experts, n, k/32], checkpoint order) in the
    /// device layout, as a new buffer: for k % 128 == 0 each expert's [n, k/128] 4-byte words transposed to
    /// [k/128, n]; otherwise the device layout is the checkpoint's and the bytes are copied unchanged.
    pub fn fp4_scales_to_device_layout(
        &self,
        stream: &std::sync::Arc<CudaStream>,
        src: &CudaSlice<u8>,
        experts: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<u8>> {
        let bytes = experts * n * (k / 32);
        check(SCALES, k.is_multiple_of(32) && src.len() >= bytes, || {
            format!(
                "{} bytes for {experts} x [{n}, {k}] (k % 32 == 0, {bytes} bytes)",
                src.len()
            )
        })?;
        let mut dst = stream.alloc_zeros::<u8>(bytes.max(1))?;
        if bytes == 0 {
            return Ok(dst);
        }
        if !k.is_multiple_of(128) {
            stream.memcpy_dtod(&src.slice(0..bytes), &mut dst)?;
            return Ok(dst);
        }
        let (ei, ni, ci) = (
            int(SCALES, "experts", experts)?,
            int(SCALES, "n", n)?,
            int(SCALES, "k / 128", k / 128)?,
        );
        let cfg = LaunchConfig {
            grid_dim: (stride_blocks((bytes / 4) as u64), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (sp, dp) = (ptr(src, stream), ptr_mut(&mut dst, stream));
        let mut l = Args::new();
        l.arg(&sp).arg(&dp).arg(&ei).arg(&ni).arg(&ci);
        // SAFETY: fp4_scales_to_device_layout(src, dst, E, N, chunks) reads and writes E * N * chunks u32:
        // src holds at least `bytes` = 4 * E * N * chunks (checked), dst was allocated with exactly that.
        unsafe { self.launch_k(stream, &self.kernels.fp4_scales_layout, cfg, &mut l) }?;
        Ok(dst)
    }
}

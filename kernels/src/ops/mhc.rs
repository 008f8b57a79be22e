//! mHC launchers (see cuda/mhc.cu): embedding into streams, HCPre/HCHead fused with the following RMSNorm
//! (and optionally with the previous mixer's HCPost), HCPost (optionally fused with the MoE output sum).
use std::sync::OnceLock;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig};
use half::bf16;

use super::{env_usize, grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "mhc";
/// Residual streams per token (hc_mult); the kernels are written for 4.
pub const HC_STREAMS: usize = 4;
/// Mixer outputs of a block mixer: (2 + n) * n.
pub const HC_MIX: usize = 24;
/// Columns of the flat stream vector per partial-sum block (cuda MHC_CHUNK).
const CHUNK: usize = 128;
/// Widest row hc_finish keeps in shared memory (cuda MHC_MAX_D).
const FINISH_MAX_D: usize = 8192;
/// Rows per hc_mix_tile24 block (cuda MHC_TILE_ROWS) and its dynamic shared memory (cuda MHC_TILE_SMEM).
const TILE_ROWS: usize = 128;
pub(crate) const TILE_SMEM: usize = 2 * (TILE_ROWS * CHUNK * 2 + HC_MIX * CHUNK * 4);
/// Chunk lanes of the tiled partial sums: hc_mix_tile24 writes lane l's chunks l, l + 32, ... already summed.
const TILE_LANES: usize = 32;
/// Rows from which a block mixer's HCPre without a fused HCPost and an HCPost use the kernels for many rows
/// (mhc_wide.cu; the same bits). Below, the decode kernels (a batch of at most 64 rows) are the faster.
const TILE_MIN_DEFAULT: usize = 256;

/// `DSV4_HC_TILE_MIN` overrides [`TILE_MIN_DEFAULT`] (A/B runs: a huge value keeps the decode kernels).
fn tile_min() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| env_usize("DSV4_HC_TILE_MIN").unwrap_or(TILE_MIN_DEFAULT))
}

/// One HCPre (block mixer, `head == false`) or HCHead (`head == true`) plus RMSNorm.
#[derive(Debug, Clone, Copy)]
pub struct HcPre {
    pub rows: usize,
    pub d: usize,
    pub norm_eps: f32,
    pub hc_eps: f32,
    pub sinkhorn_iters: usize,
    pub head: bool,
    /// The FP8 fake-quantised copy `yq` is taken of the bf16 output `y` (the attention's x quant, same bits
    /// as attn_row_prep of `y`) instead of the f32 normalised values (the expert GEMVs' input).
    pub yq_bf16: bool,
}

impl HcPre {
    fn mixes(&self) -> usize {
        if self.head {
            HC_STREAMS
        } else {
            HC_MIX
        }
    }
    fn chunks(&self) -> usize {
        (HC_STREAMS * self.d).div_ceil(CHUNK)
    }
}

/// The e4m3 codes `[rows, D]` and f32 block scales `[rows, D / 128]` of an HCPre's fake-quantised output
/// (code * scale = yq): the FP8-activation GEMVs' input (GemvQ8X). Needs D % 128 == 0.
pub struct HcCodes<'a> {
    pub codes: &'a mut CudaSlice<u8>,
    pub scales: &'a mut CudaSlice<f32>,
}

/// The previous mixer's HCPost, fused into an HCPre on the same streams (see [`GpuContext::launch_hc_pre`]).
#[derive(Debug)]
pub struct HcPost<'a> {
    /// The sub-block output.
    pub f: HcPostF<'a>,
    /// Scratch bf16 `[rows, 4, D]` for the updated streams (copied back into `x` by the same launches).
    pub scratch: &'a mut CudaSlice<bf16>,
}

/// The sub-block output f of a fused HCPost.
#[derive(Debug, Clone, Copy)]
pub enum HcPostF<'a> {
    /// f bf16 `[rows, D]` (the attention output).
    Bf16(&'a CudaSlice<bf16>),
    /// f = bf16(sum_k routed[r*topk+k] + shared[r]): `routed` f32 `[rows*topk, D]`, `shared` f32 `[rows, D]`.
    Moe {
        routed: &'a CudaSlice<f32>,
        shared: &'a CudaSlice<f32>,
        topk: usize,
    },
}

/// cuda MhcPost (by value); `mix` 0: no fused HCPost.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct MhcPost {
    mix: u64,
    f_bf16: u64,
    ys: u64,
    ysh: u64,
    xo: u64,
    topk: i32,
    mode: i32,
}

// SAFETY: #[repr(C)] u64/i32 fields laid out as the C struct MhcPost in cuda/mhc.cu; no references.
unsafe impl DeviceRepr for MhcPost {}

/// f32 elements of partial-sum workspace an [`HcPre`] of `rows` x `d` needs (block mixer, the larger).
pub fn hc_workspace_len(rows: usize, d: usize) -> usize {
    (HC_STREAMS * d).div_ceil(CHUNK) * rows * (HC_MIX + 1)
}

/// Which hc_mix_partial instance serves `rows` rows: the index of MG (mix groups of the block's 8 warps)
/// in [1, 2, 4, 8]. 8+ rows: every warp takes its own rows and all mixes (MG = 1); fewer rows leave warps
/// without a row, so they split the mixes instead (1 row: 8 warps x 3-4 mixes).
fn mix_groups(rows: usize) -> usize {
    match rows {
        8.. => 0,
        4..=7 => 1,
        2..=3 => 2,
        _ => 3,
    }
}

fn check_d(d: usize) -> Result<i32> {
    check(NAME, d > 0 && d.is_multiple_of(8), || {
        format!("D = {d} must be a positive multiple of 8")
    })?;
    int(NAME, "D", d)
}

impl GpuContext {
    /// X[r, j, :] = table[ids[r], :] for each of the 4 streams. `table` bf16 [vocab, D], `x` [rows, 4, D].
    pub fn launch_embed_streams(
        &self,
        stream: &CudaStream,
        rows: usize,
        d: usize,
        ids: &impl DevicePtr<i32>,
        table: &impl DevicePtr<bf16>,
        x: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        let di = check_d(d)?;
        check(
            NAME,
            rows > 0 && ids.len() >= rows && x.len() >= rows * HC_STREAMS * d,
            || format!("embed: ids {} x {} for {rows} rows", ids.len(), x.len()),
        )?;
        let (ip, tp, xp) = (ptr(ids, stream), ptr(table, stream), ptr_mut(x, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, rows)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&ip).arg(&tp).arg(&xp).arg(&di);
        // SAFETY: embed_streams(ids, table, X, D); ids holds rows ids (the caller keeps them < vocab, the
        // table's row count), X holds rows*4*D.
        unsafe { self.launch_k(stream, &self.kernels.runner.embed_streams, cfg, &mut l) }?;
        Ok(())
    }

    /// HCPre (or HCHead) then RMSNorm: `x` bf16 [rows, 4, D]; `func` f32 [M, 4D]; `base` f32 [M];
    /// `scale` f32 [3] ([1] for the head); `norm_w` f32 [D]; `ws` f32 [`hc_workspace_len`]; `mix` f32
    /// [rows, 24] (post, comb: written by block mixers only); `y` bf16 [rows, D] normalised output; `yq`
    /// (optional) bf16 [rows, D] its FP8 fake quantisation (blocks of 128, see [`HcPre::yq_bf16`]), `codes`
    /// (optional, with `yq` only) yq's e4m3 codes and scales.
    /// `post`: first apply the previous mixer's HCPost to `x` (coefficients read from `mix` before this
    /// mixer overwrites them), fused into these launches: one launch fewer, the same bits as
    /// [`Self::launch_hc_post`] / [`Self::launch_hc_post_moe`] first.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_hc_pre(
        &self,
        stream: &CudaStream,
        p: &HcPre,
        x: &mut impl DevicePtrMut<bf16>,
        func: &impl DevicePtr<f32>,
        base: &impl DevicePtr<f32>,
        scale: &impl DevicePtr<f32>,
        norm_w: &impl DevicePtr<f32>,
        ws: &mut impl DevicePtrMut<f32>,
        mix: &mut impl DevicePtrMut<f32>,
        y: &mut impl DevicePtrMut<bf16>,
        yq: Option<&mut CudaSlice<bf16>>,
        codes: Option<HcCodes<'_>>,
        post: Option<HcPost<'_>>,
    ) -> Result<()> {
        let (rows, d, m) = (p.rows, p.d, p.mixes());
        let di = check_d(d)?;
        check(NAME, d <= FINISH_MAX_D, || {
            format!("hc_pre: D = {d} above {FINISH_MAX_D}")
        })?;
        let nd = HC_STREAMS * d;
        let ok = rows > 0
            && x.len() >= rows * nd
            && func.len() >= m * nd
            && base.len() >= m
            && scale.len() >= if p.head { 1 } else { 3 }
            && norm_w.len() >= d
            && ws.len() >= p.chunks() * rows * (m + 1)
            && mix.len() >= rows * HC_MIX
            && y.len() >= rows * d
            && yq.as_ref().is_none_or(|q| q.len() >= rows * d)
            && codes.as_ref().is_none_or(|c| {
                yq.is_some()
                    && d.is_multiple_of(128)
                    && c.codes.len() >= rows * d
                    && c.scales.len() >= rows * d / 128
            });
        check(NAME, ok, || {
            format!("hc_pre: a buffer is too short for {rows} rows, D {d}")
        })?;
        let (ri, ci) = (int(NAME, "rows", rows)?, int(NAME, "chunks", p.chunks())?);
        let iters = int(NAME, "iters", p.sinkhorn_iters)?;
        let which = usize::from(p.head);
        let (xp, fp, wsp) = (ptr_mut(x, stream), ptr(func, stream), ptr_mut(ws, stream));
        let mp = ptr_mut(mix, stream);
        let fused = post.is_some();
        let post_args = match post {
            Some(post) => post_args(stream, rows, d, mp, post)?,
            None => MhcPost::default(),
        };
        let kernels = &self.kernels.runner;
        let tiled = !fused && !p.head && rows >= tile_min();
        let lanes = p.chunks().min(TILE_LANES);
        let ci = match tiled {
            true => int(NAME, "chunks", lanes)?,
            false => ci,
        };
        if tiled {
            let cfg = LaunchConfig {
                grid_dim: (grid(NAME, lanes)?, grid(NAME, rows.div_ceil(TILE_ROWS))?, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: TILE_SMEM as u32,
            };
            let mut l = Args::new();
            l.arg(&xp).arg(&fp).arg(&wsp).arg(&ri).arg(&di);
            // SAFETY: hc_mix_tile24(X, fn, ws, rows, D); X holds rows*4D, fn 24*4D, ws chunks*rows*25 (it writes
            // min(chunks, 32)*rows*25).
            unsafe { self.launch_k(stream, &kernels.hc_wide.tile, cfg, &mut l) }?;
        } else {
            let partial = match fused {
                true => &kernels.hc_post_mix[which][mix_groups(rows)],
                false => &kernels.hc_mix_partial[which][mix_groups(rows)],
            };
            let cfg = LaunchConfig {
                grid_dim: (grid(NAME, p.chunks())?, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut l = Args::new();
            l.arg(&xp)
                .arg(&fp)
                .arg(&wsp)
                .arg(&ri)
                .arg(&di)
                .arg(&post_args);
            // SAFETY: hc_{mix_partial,post_mix}M_mgG(X, fn, ws, rows, D, post); X holds rows*4D, fn M*4D, ws
            // chunks*rows*(M+1); post's buffers were checked by post_args (all null without a fused HCPost).
            unsafe { self.launch_k(stream, partial, cfg, &mut l) }?;
        }
        let (sp, bp, np) = (ptr(scale, stream), ptr(base, stream), ptr(norm_w, stream));
        let yp = ptr_mut(y, stream);
        let qp = yq.map_or(0, |q| ptr_mut(q, stream));
        let (cp, csp) = codes.map_or((0, 0), |c| {
            (ptr_mut(c.codes, stream), ptr_mut(c.scales, stream))
        });
        let yq_bf16 = i32::from(p.yq_bf16);
        // After a fused HCPost the finish reads the scratch streams and copies them back into X.
        let (x_read, x_copy) = match fused {
            true => (post_args.xo, xp),
            false => (xp, 0),
        };
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, rows)?, 1, 1),
            block_dim: (288, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&x_read)
            .arg(&wsp)
            .arg(&ci)
            .arg(&ri)
            .arg(&di)
            .arg(&sp)
            .arg(&bp)
            .arg(&np);
        l.arg(&p.norm_eps)
            .arg(&p.hc_eps)
            .arg(&iters)
            .arg(&mp)
            .arg(&yp)
            .arg(&qp)
            .arg(&yq_bf16)
            .arg(&cp)
            .arg(&csp)
            .arg(&x_copy);
        let finish = match tiled {
            true => &kernels.hc_wide.finish,
            false => &kernels.hc_finish[which],
        };
        // SAFETY: hc_finish{M,24_wide}(X, ws, chunks, rows, D, scale, base, norm_w, eps, hc_eps, iters, mix, y,
        // yq, yq_bf16, yc, ycs, xcopy); every buffer was checked above (yq null: no quantised copy; yc / ycs null:
        // no codes, else rows x D codes and rows x D / 128 scales with D % 128 == 0; xcopy null: none,
        // always so for the wide form, which tiled excludes from fused calls).
        unsafe { self.launch_k(stream, finish, cfg, &mut l) }?;
        Ok(())
    }

    /// HCPost in place on `x` [rows, 4, D] with the sub-block output `f` bf16 [rows, D].
    pub fn launch_hc_post(
        &self,
        stream: &CudaStream,
        rows: usize,
        d: usize,
        x: &mut impl DevicePtrMut<bf16>,
        mix: &impl DevicePtr<f32>,
        f: &impl DevicePtr<bf16>,
    ) -> Result<()> {
        check(NAME, f.len() >= rows * d, || "hc_post: f too short".into())?;
        let fp = ptr(f, stream);
        self.hc_post_launch(stream, rows, d, x, mix, [fp, 0, 0], 0, 0)
    }

    /// HCPost with f = bf16(sum_k routed[r*topk+k] + shared[r]): `routed` f32 [rows*topk, D], `shared` f32
    /// [rows, D] (the MoE's expert outputs; the sum is the MoE output).
    #[allow(clippy::too_many_arguments)]
    pub fn launch_hc_post_moe(
        &self,
        stream: &CudaStream,
        rows: usize,
        d: usize,
        topk: usize,
        x: &mut impl DevicePtrMut<bf16>,
        mix: &impl DevicePtr<f32>,
        routed: &impl DevicePtr<f32>,
        shared: &impl DevicePtr<f32>,
    ) -> Result<()> {
        check(
            NAME,
            routed.len() >= rows * topk * d && shared.len() >= rows * d,
            || "hc_post_moe: expert outputs too short".into(),
        )?;
        let ptrs = [0, ptr(routed, stream), ptr(shared, stream)];
        self.hc_post_launch(stream, rows, d, x, mix, ptrs, int(NAME, "topk", topk)?, 1)
    }

    #[allow(clippy::too_many_arguments)]
    fn hc_post_launch(
        &self,
        stream: &CudaStream,
        rows: usize,
        d: usize,
        x: &mut impl DevicePtrMut<bf16>,
        mix: &impl DevicePtr<f32>,
        f: [u64; 3],
        topk: i32,
        mode: i32,
    ) -> Result<()> {
        let di = check_d(d)?;
        check(
            NAME,
            rows > 0 && x.len() >= rows * HC_STREAMS * d && mix.len() >= rows * HC_MIX,
            || "hc_post: x or mix too short".into(),
        )?;
        let (xp, mp) = (ptr_mut(x, stream), ptr(mix, stream));
        // hc_post8 takes 8 columns per thread.
        let (kernel, cols) = match rows >= tile_min() {
            true => (&self.kernels.runner.hc_wide.post, 256 * 8),
            false => (&self.kernels.runner.hc_post, 256),
        };
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, rows)?, grid(NAME, d.div_ceil(cols))?, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&xp).arg(&mp).arg(&f[0]).arg(&f[1]).arg(&f[2]);
        l.arg(&di).arg(&topk).arg(&mode);
        // SAFETY: hc_post{,8}(X, mix, f_bf16, ys, ysh, D, topk, mode); X and mix checked here, the f source of
        // the mode by the caller; the unused pointers are null and never read.
        unsafe { self.launch_k(stream, kernel, cfg, &mut l) }?;
        Ok(())
    }
}

/// The fused HCPost's kernel arguments, after checking its buffers against `rows` x `d`; `mix` is the
/// mixer's coefficient buffer (checked by the caller).
fn post_args(
    stream: &CudaStream,
    rows: usize,
    d: usize,
    mix: u64,
    post: HcPost<'_>,
) -> Result<MhcPost> {
    check(NAME, post.scratch.len() >= rows * HC_STREAMS * d, || {
        "hc_pre post: scratch streams too short".into()
    })?;
    let xo = ptr_mut(post.scratch, stream);
    Ok(match post.f {
        HcPostF::Bf16(f) => {
            check(NAME, f.len() >= rows * d, || {
                "hc_pre post: f too short".into()
            })?;
            MhcPost {
                mix,
                f_bf16: ptr(f, stream),
                xo,
                ..MhcPost::default()
            }
        }
        HcPostF::Moe {
            routed,
            shared,
            topk,
        } => {
            check(
                NAME,
                routed.len() >= rows * topk * d && shared.len() >= rows * d,
                || "hc_pre post: expert outputs too short".into(),
            )?;
            MhcPost {
                mix,
                ys: ptr(routed, stream),
                ysh: ptr(shared, stream),
                xo,
                topk: int(NAME, "topk", topk)?,
                mode: 1,
                ..MhcPost::default()
            }
        }
    })
}

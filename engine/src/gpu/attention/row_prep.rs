//! The three ways the attention block uses `attn_row_prep` (decode, prefill and the tensor-parallel output
//! alike): each constructor fixes the fields its use implies, so a call site names only buffers and shape.
use super::acts::AttnActs;
use super::layer::AttnLayer;
use super::{dptr, dptr_mut};
use dsv4_kernels::attn::AttnRowPrep;
use dsv4_kernels::cudarc::driver::CudaStream;

/// FP8 activation-quant block of the official numerics.
const ACT_BLOCK: i32 = 128;

/// `quant_blk` of a prep whose output feeds an FP8 linear only in the official numerics.
fn quant_blk(quant: bool) -> i32 {
    if quant {
        ACT_BLOCK
    } else {
        0
    }
}

/// FP8 activation quant of the bf16 block input `[rows, width]` at `x` into bf16 `out` (no norm): the
/// input of an FP8 linear in the official numerics.
pub(crate) fn quant_input(x: u64, out: u64, rows: usize, width: usize) -> AttnRowPrep {
    AttnRowPrep {
        x,
        out,
        groups: 1,
        rows: rows as i32,
        width: width as i32,
        quant_blk: ACT_BLOCK,
        ..Default::default()
    }
}

/// q_norm of the wq_a output (`act.qr_f32` f32 `[rows, q_lora_rank]`) into bf16 `act.qr`, FP8-quantised
/// when `quant` (the input of wq_b and the indexer's wq_b).
pub(crate) fn q_norm(
    s: &CudaStream,
    layer: &AttnLayer,
    act: &mut AttnActs,
    rows: usize,
    quant: bool,
) -> AttnRowPrep {
    AttnRowPrep {
        x: dptr(&act.qr_f32, s),
        norm_w: dptr(&layer.q_norm, s),
        out: dptr_mut(&mut act.qr, s),
        x_f32: 1,
        groups: 1,
        rows: rows as i32,
        width: layer.cfg.q_lora_rank as i32,
        quant_blk: quant_blk(quant),
        eps: layer.cfg.rms_norm_eps,
        ..Default::default()
    }
}

/// The f32 latents `[groups, rows, width]` at `x` as bf16 rows `[rows, groups·width]` at `out` (the input of
/// `wo_b`), FP8-quantised when `quant`.
pub(crate) fn regroup(
    x: u64,
    out: u64,
    groups: usize,
    rows: usize,
    width: usize,
    quant: bool,
) -> AttnRowPrep {
    AttnRowPrep {
        x,
        out,
        x_f32: 1,
        groups: groups as i32,
        rows: rows as i32,
        width: width as i32,
        quant_blk: quant_blk(quant),
        ..Default::default()
    }
}

//! The three ways the attention block uses `attn_row_prep` (decode, prefill and the tensor-parallel output
//! alike): each constructor fixes the fields its use implies, so a call site names only buffers and shape.
use dsv4_kernels::attn::AttnRowPrep;

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

/// RMS norm (weight `norm_w`, `eps`) of f32 rows `[rows, width]` at `x` into bf16 `out`, FP8-quantised
/// when `quant`.
pub(crate) fn norm_f32(
    x: u64,
    norm_w: u64,
    out: u64,
    rows: usize,
    width: usize,
    eps: f32,
    quant: bool,
) -> AttnRowPrep {
    AttnRowPrep {
        x,
        norm_w,
        out,
        x_f32: 1,
        groups: 1,
        rows: rows as i32,
        width: width as i32,
        quant_blk: quant_blk(quant),
        eps,
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

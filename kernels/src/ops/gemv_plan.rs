//! Split-K plans and scratch sizes of the decode GEMVs (gemv.rs launches them): one split planner per kernel
//! family, the workspace and the arrival counters a launch needs.
use super::gemv::{GemvParams, GemvWeights, GEMV_GROUPS, GEMV_ROW_TILE};
use super::gemv_ring::{ring_splits, GemvPath};
use crate::error::{check, Result};

/// Split-K of a launch on `path` with `tiles` 32-row tiles in all (sum over groups) and inner dim `k`.
/// Skinny: about two blocks per SM (from the device's SM count), every warp keeping at least one K step;
/// but no split when the row tiles alone give at least half a block per SM and each warp would keep at most
/// 4 K steps (kbench split sweep, BENCH_NOTES 2026-11-30: wo_a 15.0 -> 13.5 us and shared w2 7.9 -> 7.2 us
/// at batch 1; there the second pass and its counters cost more than the extra blocks bring).
/// Ring: see gemv_ring.rs. Independent of the batch size within a family.
pub fn gemv_splits(sms: usize, tiles: usize, k: usize, wt: GemvWeights, path: GemvPath) -> usize {
    let ksteps = k.div_ceil(wt.k_step());
    match path {
        GemvPath::Skinny if 2 * tiles >= sms && ksteps <= 4 * 8 => 1,
        GemvPath::Skinny => (2 * sms)
            .div_ceil(tiles.max(1))
            .clamp(1, ksteps.div_ceil(8).max(1)),
        GemvPath::Ring => ring_splits(sms, tiles, k, wt),
    }
}

/// The most splits either family plans for this shape (for sizing a scratch that serves every batch).
pub fn gemv_splits_max(sms: usize, tiles: usize, k: usize, wt: GemvWeights) -> usize {
    [GemvPath::Skinny, GemvPath::Ring]
        .into_iter()
        .map(|p| gemv_splits(sms, tiles, k, wt, p))
        .max()
        .unwrap_or(1)
}

/// f32 workspace of a launch (0 without split).
pub fn gemv_ws_len(groups: usize, splits: usize, b: usize, nmax: usize) -> usize {
    if splits > 1 {
        groups * splits * b * nmax
    } else {
        0
    }
}

/// Split-K arrival counters of a launch (zeroed once; the kernel resets what it uses).
pub fn gemv_cnt_len(groups: usize, nmax: usize) -> usize {
    groups * nmax.div_ceil(GEMV_ROW_TILE)
}

/// The checks every grouped launch of `p` makes, whatever its kernel: 1..=GEMV_GROUPS groups, every group's
/// rows in 1..=nmax, and a workspace / counters (`ws_len` / `cnt_len`) large enough for `splits`.
pub(crate) fn check_groups_and_scratch(
    name: &'static str,
    p: &GemvParams,
    (groups, splits): (usize, usize),
    (ws_len, cnt_len): (usize, usize),
) -> Result<()> {
    let (b, nmax) = (p.b.max(0) as usize, p.nmax.max(0) as usize);
    check(name, (1..=GEMV_GROUPS).contains(&groups), || {
        format!("groups {groups}")
    })?;
    check(
        name,
        p.n[..groups].iter().all(|&n| n > 0 && n as usize <= nmax),
        || format!("n {:?} nmax {nmax}", &p.n[..groups]),
    )?;
    check(
        name,
        ws_len >= gemv_ws_len(groups, splits, b, nmax)
            && (splits == 1 || cnt_len >= gemv_cnt_len(groups, nmax)),
        || format!("workspace {ws_len} / counters {cnt_len} too small"),
    )
}

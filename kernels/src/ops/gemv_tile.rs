//! Batch tiles of a grouped GEMV launch: the batch cut into equal tiles of rows, each (group, tile) pair
//! one group of the same kernel, so a block computes fewer batch columns and there are more blocks.
//!
//! Why the bits do not change: every kernel family computes a batch column's outputs in its own MMA column
//! tile, with the same weight fragments, the same K order, the same block reduction and the same split-K
//! sum whatever the other columns are (the batch-invariance tests of gemv.cu and both rings); the split
//! count stays the one planned for the whole launch. What changes is the work of one block: at 64 rows a
//! small-N launch is a few blocks that each stage and multiply all 64 rows of x (the MoE gate: 64 blocks),
//! and its tiles re-read the same weights from L2 instead.
use super::env_usize;
use super::gemv::{gemv_cnt_len, GemvParams, GEMV_GROUPS, GEMV_ROW_TILE};
use super::gemv_ring::GemvPath;

/// Rows of a ring block (128; the mma.sync ring's 256-row blocks count as two: the estimate only decides
/// whether a launch is small).
const GEMV_RING_ROWS: usize = 128;

/// Environment override of the rows per tile for every launch (`0`: no tiles), for measuring.
const ENV: &str = "DSV4_GEMV_BATCH_TILE";

fn env_tile_rows() -> Option<usize> {
    static V: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_usize(ENV))
}

/// The launch a tiling decision looks at.
struct TileQuery {
    path: GemvPath,
    b: usize,
    groups: usize,
    /// Blocks of the untiled launch, and the device's SMs.
    blocks: usize,
    sms: usize,
    nmax: usize,
    /// Split-K counters the launch may use (usize::MAX without split).
    cnt_len: usize,
}

/// How many equal tiles to cut the launch's rows into (1: none). `rows`: at least that many rows per tile
/// (Some(0): none); None: the default, tiles of 8 rows for gemv.cu launches of at most half a block per SM
/// and of 32 rows for ring launches of fewer blocks than SMs. kbench at 16-64 rows (BENCH_NOTES, fourteenth
/// session): the MoE gate on gemv.cu (64 blocks) 14.8 -> 7.5 us at 64 rows, 9.0 -> 6.5 at 32, 5.8 -> 4.7 at
/// 16; on the ring, the HCA projection (64 blocks) 15.1 -> 10.2 and wq_a + wkv (96) 17.6 -> 13.6 at 64 rows.
/// Slower tiled: gemv.cu launches of 128 blocks (the shared expert's w2 at 16 rows 6.7 -> 8.4 us) and ring
/// launches of 168 or more (w1 + w3 at 64 rows 18.7 -> 25.7, wo_b 26.2 -> 40.5).
fn batch_tiles(rows: Option<usize>, q: &TileQuery) -> usize {
    let rows = match (rows.or_else(env_tile_rows), q.path) {
        (Some(r), _) => r,
        (None, GemvPath::Skinny) if 2 * q.blocks <= q.sms => 8,
        (None, GemvPath::Ring) if q.blocks < q.sms => 32,
        (None, _) => 0,
    };
    batch_tiles_for(rows, q.b, q.groups, q.nmax, q.cnt_len)
}

fn batch_tiles_for(rows: usize, b: usize, groups: usize, nmax: usize, cnt_len: usize) -> usize {
    if rows == 0 || groups == 0 {
        return 1;
    }
    let most = (b / rows).min(GEMV_GROUPS / groups);
    (1..=most)
        .rev()
        .find(|&t| b.is_multiple_of(t) && cnt_len >= gemv_cnt_len(groups * t, nmax))
        .unwrap_or(1)
}

/// `p` (its first `groups` groups) as `groups * tiles` groups of `p.b / tiles` rows: group g's tile t is group
/// `g * tiles + t`, its x and outputs moved by `t * rows` rows (x bf16; outputs f32 or bf16 as `p.out_bf16`).
fn tiled(p: &GemvParams, groups: usize, tiles: usize) -> GemvParams {
    let rows = p.b as usize / tiles;
    let out_bytes = if p.out_bf16 != 0 { 2 } else { 4 };
    let mut q = GemvParams {
        b: rows as i32,
        ..*p
    };
    for g in 0..groups {
        for t in 0..tiles {
            let (i, r0) = (g * tiles + t, (t * rows) as u64);
            q.x[i] = p.x[g] + 2 * r0 * p.k as u64;
            q.out[i] = p.out[g] + out_bytes * r0 * p.n[g] as u64;
            (q.w[i], q.s[i], q.n[i]) = (p.w[g], p.s[g], p.n[g]);
        }
    }
    q
}

/// `p` (`groups` groups, `splits` K splits, on `path`) as the launcher runs it when batch_tiles cuts it:
/// the tiled parameters and their group count, or None.
pub(crate) fn tiled_launch(
    p: &GemvParams,
    (groups, splits): (usize, usize),
    (path, rows): (GemvPath, Option<usize>),
    sms: usize,
    cnt_len: usize,
) -> Option<(GemvParams, usize)> {
    let block_rows = match path {
        GemvPath::Skinny => GEMV_ROW_TILE,
        GemvPath::Ring => GEMV_RING_ROWS,
    };
    let nmax = p.nmax.max(0) as usize;
    let query = TileQuery {
        path,
        b: p.b.max(0) as usize,
        groups,
        blocks: nmax.div_ceil(block_rows) * splits * groups,
        sms,
        nmax,
        cnt_len,
    };
    let tiles = batch_tiles(rows, &query);
    (tiles > 1).then(|| (tiled(p, groups, tiles), groups * tiles))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_divide_the_batch_and_fit_the_groups_and_counters() {
        let cnt = gemv_cnt_len(GEMV_GROUPS, 1024);
        assert_eq!(batch_tiles_for(8, 64, 1, 1024, cnt), 8);
        assert_eq!(batch_tiles_for(8, 64, 2, 1024, cnt), 4);
        assert_eq!(batch_tiles_for(8, 64, 3, 1024, cnt), 2);
        assert_eq!(batch_tiles_for(8, 64, 8, 1024, cnt), 1);
        assert_eq!(batch_tiles_for(16, 64, 1, 1024, cnt), 4);
        assert_eq!(
            batch_tiles_for(8, 12, 1, 1024, cnt),
            1,
            "12 / 8 rounds down to one tile"
        );
        assert_eq!(batch_tiles_for(4, 12, 1, 1024, cnt), 3);
        assert_eq!(batch_tiles_for(8, 13, 1, 1024, cnt), 1, "prime batch");
        assert_eq!(batch_tiles_for(8, 7, 1, 1024, cnt), 1);
        assert_eq!(batch_tiles_for(0, 64, 1, 1024, cnt), 1, "off");
        // Counters for 2 groups only: at most 2 tiles of one group.
        assert_eq!(batch_tiles_for(8, 64, 1, 1024, gemv_cnt_len(2, 1024)), 2);
    }

    #[test]
    fn default_tiles_only_small_launches() {
        if env_tile_rows().is_some() {
            eprintln!("SKIP: {ENV} overrides the default");
            return;
        }
        let q = |path, b, groups, blocks| TileQuery {
            path,
            b,
            groups,
            blocks,
            sms: 132,
            nmax: 1024,
            cnt_len: usize::MAX,
        };
        // The MoE gate at 64 / 32 / 16 rows on gemv.cu (64 blocks): tiles of 8.
        assert_eq!(batch_tiles(None, &q(GemvPath::Skinny, 64, 1, 64)), 8);
        assert_eq!(batch_tiles(None, &q(GemvPath::Skinny, 32, 1, 64)), 4);
        assert_eq!(batch_tiles(None, &q(GemvPath::Skinny, 16, 1, 64)), 2);
        // Ring launches of fewer blocks than SMs: tiles of 32 rows.
        assert_eq!(batch_tiles(None, &q(GemvPath::Ring, 64, 2, 96)), 2);
        assert_eq!(batch_tiles(None, &q(GemvPath::Ring, 48, 1, 64)), 1);
        // As many blocks as SMs or more: none; an explicit size overrides.
        assert_eq!(batch_tiles(None, &q(GemvPath::Ring, 64, 1, 256)), 1);
        assert_eq!(batch_tiles(None, &q(GemvPath::Skinny, 64, 1, 132)), 1);
        assert_eq!(batch_tiles(None, &q(GemvPath::Skinny, 16, 1, 128)), 1);
        assert_eq!(batch_tiles(None, &q(GemvPath::Skinny, 16, 1, 66)), 2);
        assert_eq!(batch_tiles(Some(16), &q(GemvPath::Ring, 64, 1, 256)), 4);
        assert_eq!(batch_tiles(Some(0), &q(GemvPath::Skinny, 64, 1, 64)), 1);
    }

    #[test]
    fn tiled_params_move_x_and_outputs_by_the_tile_rows() {
        let mut p = GemvParams {
            b: 16,
            k: 100,
            nmax: 300,
            out_bf16: 1,
            ..Default::default()
        };
        (p.x[0], p.w[0], p.s[0], p.out[0], p.n[0]) = (1000, 7, 9, 50_000, 300);
        (p.x[1], p.w[1], p.s[1], p.out[1], p.n[1]) = (2000, 8, 10, 60_000, 200);
        let q = tiled(&p, 2, 2);
        assert_eq!(q.b, 8);
        assert_eq!(
            q.x[..4],
            [1000, 1000 + 2 * 8 * 100, 2000, 2000 + 2 * 8 * 100]
        );
        assert_eq!(
            q.out[..4],
            [50_000, 50_000 + 2 * 8 * 300, 60_000, 60_000 + 2 * 8 * 200]
        );
        assert_eq!(q.w[..4], [7, 7, 8, 8]);
        assert_eq!(q.s[..4], [9, 9, 10, 10]);
        assert_eq!(q.n[..4], [300, 300, 200, 200]);
        assert_eq!(
            (q.k, q.nmax, q.out_bf16, q.ws, q.cnt),
            (100, 300, 1, p.ws, p.cnt)
        );
    }
}

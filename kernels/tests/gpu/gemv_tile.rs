//! Batch tiles of grouped GEMV launches (ops/gemv_tile.rs): the same bits as the untiled launch, for both
//! weight formats, every kernel family, 1-3 groups, tiles as the launcher cuts them (divisors of the batch
//! limited by the 8 group slots), f32 and bf16 outputs.
use dsv4_kernels::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dsv4_kernels::{
    bf16, gemv_cnt_len, gemv_splits, gemv_ws_len, GemvParams, GemvPath, GemvScratch, GemvWeights,
    GpuContext, RingTune, GEMV_GROUPS, GEMV_ROW_TILE,
};

use crate::common::*;

struct Grouped {
    x: CudaSlice<bf16>,
    w: Vec<CudaSlice<u8>>,
    s: Vec<CudaSlice<u8>>,
    ns: Vec<usize>,
    k: usize,
    wt: GemvWeights,
}

impl Grouped {
    fn new(g: &GpuContext, seed: u64, wt: GemvWeights, ns: &[usize], k: usize, b: usize) -> Self {
        let mut r = rng(seed);
        let x = upload(g, &rand_bf16(&mut r, b * k));
        let esz = if wt == GemvWeights::Fp8 { 1 } else { 2 };
        let w = ns
            .iter()
            .map(|&n| match wt {
                GemvWeights::Fp8 => upload(g, &rand_e4m3(&mut r, n * k)),
                GemvWeights::Bf16 => {
                    let v = rand_bf16(&mut r, n * k);
                    let bytes: Vec<u8> = v.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect();
                    upload(g, &bytes[..n * k * esz])
                }
            })
            .collect();
        let s = ns
            .iter()
            .map(|&n| {
                let len = n.div_ceil(128) * k.div_ceil(128);
                upload(g, &rand_exponents(&mut r, len, 110, 130))
            })
            .collect();
        Grouped {
            x,
            w,
            s,
            ns: ns.to_vec(),
            k,
            wt,
        }
    }

    /// Every group's outputs, concatenated, from one launch of `b` rows on `path` with `tune`.
    fn run(
        &self,
        g: &GpuContext,
        b: usize,
        path: GemvPath,
        tune: RingTune,
        out_bf16: bool,
    ) -> Vec<f32> {
        let s = &g.stream;
        let (k, wt) = (self.k, self.wt);
        let tiles: usize = self.ns.iter().map(|n| n.div_ceil(GEMV_ROW_TILE)).sum();
        let nmax = self.ns.iter().copied().max().unwrap_or(1);
        let splits = gemv_splits(g.info.sm_count as usize, tiles, k, wt, path);
        let (wl, cl) = (
            gemv_ws_len(self.ns.len(), splits, b, nmax),
            gemv_cnt_len(GEMV_GROUPS, nmax),
        );
        let mut scr = GemvScratch::new(s, wl, cl).expect("scratch");
        let esz = if out_bf16 { 2 } else { 4 };
        let mut ys: Vec<CudaSlice<u8>> = self
            .ns
            .iter()
            .map(|&n| upload(g, &vec![0xffu8; b * n * esz]))
            .collect();
        let mut p = GemvParams {
            b: b as i32,
            k: k as i32,
            nmax: nmax as i32,
            out_bf16: i32::from(out_bf16),
            ws: scr.ws.device_ptr_mut(s).0,
            cnt: scr.cnt.device_ptr_mut(s).0,
            ..Default::default()
        };
        for (i, &n) in self.ns.iter().enumerate() {
            p.n[i] = n as i32;
            p.x[i] = self.x.device_ptr(s).0;
            p.w[i] = self.w[i].device_ptr(s).0;
            p.s[i] = self.s[i].device_ptr(s).0;
            p.out[i] = ys[i].device_ptr_mut(s).0;
        }
        // SAFETY: x holds b*k bf16, w[i] n[i]*k weights (+ their scales), ys[i] b*n[i] outputs of esz bytes;
        // the scratch has the lengths passed.
        unsafe {
            g.launch_gemv_grouped_tuned(s, wt, self.ns.len(), splits, (path, tune), &p, wl, cl)
        }
        .expect("launch");
        ys.iter()
            .flat_map(|y| {
                let bytes: Vec<u8> = download(g, y);
                if out_bf16 {
                    bytes
                        .chunks_exact(2)
                        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                        .collect::<Vec<_>>()
                } else {
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                }
            })
            .collect()
    }
}

#[test]
fn batch_tiles_give_the_untiled_bits() {
    let Some(g) = gpu() else { return };
    let (fp8, bf) = (GemvWeights::Fp8, GemvWeights::Bf16);
    // (format, group rows, K, batch): 1-3 groups of awkward sizes; 48 rows cut into 2, 3, 4 or 6 tiles.
    let cases: [(GemvWeights, &[usize], usize, usize); 5] = [
        (fp8, &[256], 4096, 64),
        (fp8, &[300, 1000], 1040, 64),
        (fp8, &[77, 520, 129], 272, 48),
        (bf, &[1024], 512, 48),
        (bf, &[200, 4100], 264, 64),
    ];
    let families = [
        (GemvPath::Skinny, false),
        (GemvPath::Ring, false),
        (GemvPath::Ring, true),
    ];
    for (i, &(wt, ns, k, b)) in cases.iter().enumerate() {
        let m = Grouped::new(&g, 900 + i as u64, wt, ns, k, b);
        for &(path, mma_sync) in &families {
            for out_bf16 in [false, true] {
                let tune = |rows| RingTune {
                    mma_sync,
                    tile_rows: Some(rows),
                    ..Default::default()
                };
                let want = m.run(&g, b, path, tune(0), out_bf16);
                for rows in [4, 8, 16, 32] {
                    let got = m.run(&g, b, path, tune(rows), out_bf16);
                    let what = format!(
                        "{wt:?} n={ns:?} k={k} b={b} {path:?} mma.sync {mma_sync} bf16 out {out_bf16}: \
                         tiles of >= {rows} rows"
                    );
                    assert_same_bits(&got, &want, &what);
                }
            }
            println!(
                "{wt:?} n={ns:?} k={k} b={b} {path:?} (mma.sync {mma_sync}): tiles bit-identical"
            );
        }
    }
}

//! The attention kernels at the full-size shapes the tiny models never reach, against plain f64 CPU
//! references: the split sparse attention + merge (64 heads x 512, 4 head groups, many splits, window + CSA
//! selection / HCA / window only) and the tensor-core indexer scores (64 heads x 128, entries not a multiple
//! of 16); the top-k is in gpu_attention_topk.rs. Skips without a GPU.
use dsv4_kernels::attn::*;
use dsv4_kernels::{bf16, GpuContext};

mod gpu_kernel_util;
use gpu_kernel_util::{addr, addr_mut, rnd};

fn gpu() -> Option<GpuContext> {
    gpu_kernel_util::gpu("gpu_attention_kernels")
}

fn bf16s(n: usize, seed: usize, amp: f32) -> Vec<bf16> {
    (0..n).map(|i| bf16::from_f32(rnd(i, seed) * amp)).collect()
}

const HEADS: usize = 64;
const DIM: usize = 512;
const RDIM: usize = 64;
const WINDOW: usize = 128;
const GROUPS: usize = 8;

/// One attention case: `ratio` 0 (window only), 4 with a selection of `k` entries (CSA) or 128 (HCA).
struct Case {
    ratio: usize,
    k: usize,
    positions: Vec<i32>,
    splits: usize,
}

/// f64 reference of one (row, head): softmax over the keys with the sink, inverse rope, bf16 rounding.
fn reference_head(q: &[bf16], keys: &[&[bf16]], sink: f32, freqs: &[f32], pos: i32) -> Vec<f32> {
    let scale = (DIM as f64).powf(-0.5);
    let logits: Vec<f64> = keys
        .iter()
        .map(|k| {
            let d: f64 = (0..DIM).map(|c| q[c].to_f64() * k[c].to_f64()).sum();
            d * scale
        })
        .collect();
    let m = logits.iter().copied().fold(f64::from(sink), f64::max);
    let den = (f64::from(sink) - m).exp() + logits.iter().map(|l| (l - m).exp()).sum::<f64>();
    let mut o = vec![0f64; DIM];
    for (l, k) in logits.iter().zip(keys) {
        let p = (l - m).exp() / den;
        for c in 0..DIM {
            o[c] += p * k[c].to_f64();
        }
    }
    let start = DIM - RDIM;
    for i in 0..RDIM / 2 {
        let theta = f64::from(pos) * f64::from(freqs[i]);
        let (sn, cs) = ((-theta).sin(), theta.cos());
        let (a, b) = (o[start + 2 * i], o[start + 2 * i + 1]);
        o[start + 2 * i] = a * cs - b * sn;
        o[start + 2 * i + 1] = a * sn + b * cs;
    }
    o.iter().map(|&v| v as f32).collect()
}

/// Compressed entries live after the token at `pos` (0 for window-only layers).
fn live_entries(pos: i32, ratio: usize, cap: usize) -> usize {
    (pos as usize + 1).checked_div(ratio).unwrap_or(0).min(cap)
}

fn run_attention(ctx: &GpuContext, case: &Case) {
    let s = &ctx.stream;
    let rows = case.positions.len();
    let slots = rows + 1;
    let cap = 2048usize;
    let q = bf16s(rows * HEADS * DIM, 1, 1.0);
    let ring = bf16s(slots * WINDOW * DIM, 2, 1.0);
    let comp = bf16s(slots * cap * DIM, 3, 1.0);
    let sink: Vec<f32> = (0..HEADS).map(|h| rnd(h, 4) * 2.0).collect();
    let freqs: Vec<f32> = (0..RDIM / 2)
        .map(|i| 10f32.powf(-(i as f32) / 8.0))
        .collect();
    // Row r uses slot r + 1 (slot 0 stays unused, so slot and row differ).
    let slot_ids: Vec<i32> = (0..rows as i32).map(|r| r + 1).collect();
    let k = case.k.max(1);
    let mut sel = vec![0i32; rows * k];
    for (r, &pos) in case.positions.iter().enumerate() {
        let n = live_entries(pos, case.ratio, cap);
        let c = n.min(k);
        for j in 0..c {
            // Distinct entries < n, in a scrambled order (the kernel must not assume sorted ids).
            sel[r * k + j] = ((j * 7919 + r * 13) % n.max(1)) as i32;
        }
        let mut seen = sel[r * k..r * k + c].to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), c, "test selection not distinct");
    }
    let (dq, dring, dcomp) = (
        s.clone_htod(&q).expect("q"),
        s.clone_htod(&ring).expect("ring"),
        s.clone_htod(&comp).expect("comp"),
    );
    let (dsel, dsink, dfreqs) = (
        s.clone_htod(&sel).expect("sel"),
        s.clone_htod(&sink).expect("sink"),
        s.clone_htod(&freqs).expect("freqs"),
    );
    let (dslots, dpos) = (
        s.clone_htod(&slot_ids).expect("slots"),
        s.clone_htod(&case.positions).expect("pos"),
    );
    let splits = case.splits;
    let mut part_o = s
        .alloc_zeros::<f32>(rows * splits * HEADS * DIM)
        .expect("part_o");
    let mut part_ml = s
        .alloc_zeros::<f32>(rows * splits * HEADS * 2)
        .expect("part_ml");
    let mut out = s.alloc_zeros::<bf16>(rows * HEADS * DIM).expect("out");
    let p = AttnSparse {
        q: addr(ctx, &dq),
        ring: addr(ctx, &dring),
        comp: if case.ratio > 0 { addr(ctx, &dcomp) } else { 0 },
        sel: if case.ratio == 4 { addr(ctx, &dsel) } else { 0 },
        slots: addr(ctx, &dslots),
        positions: addr(ctx, &dpos),
        part_o: addr_mut(ctx, &mut part_o),
        part_ml: addr_mut(ctx, &mut part_ml),
        heads: HEADS as i32,
        dim: DIM as i32,
        window: WINDOW as i32,
        ratio: case.ratio as i32,
        cap: cap as i32,
        k: k as i32,
        scale: (DIM as f32).powf(-0.5),
        pad: 0,
    };
    let m = AttnMerge {
        part_o: addr(ctx, &part_o),
        part_ml: addr(ctx, &part_ml),
        sink: addr(ctx, &dsink),
        freqs: addr(ctx, &dfreqs),
        positions: addr(ctx, &dpos),
        out: addr_mut(ctx, &mut out),
        splits: splits as i32,
        heads: HEADS as i32,
        dim: DIM as i32,
        rdim: RDIM as i32,
        groups: GROUPS as i32,
        rows: rows as i32,
    };
    // SAFETY: q rows x heads x dim, ring/comp [slots, window|cap, dim] with slot ids < slots, sel rows x k
    // entries < cap, part_* rows x splits x heads (x dim).
    unsafe { ctx.launch_attn_sparse_partial(s, splits, rows, &p) }.expect("partial");
    // SAFETY: as above; out holds rows x heads x dim bf16, sink heads f32, freqs rdim/2 f32.
    unsafe { ctx.launch_attn_sparse_merge(s, &m) }.expect("merge");
    let got = s.clone_dtoh(&out).expect("dtoh");
    let hpg = HEADS / GROUPS;
    let mut worst = 0f32;
    for (r, &pos) in case.positions.iter().enumerate() {
        let slot = slot_ids[r] as usize;
        let nwin = (pos as usize + 1).min(WINDOW);
        let mut keys: Vec<&[bf16]> = (0..nwin)
            .map(|i| &ring[(slot * WINDOW + i) * DIM..][..DIM])
            .collect();
        if case.ratio > 0 {
            let n = live_entries(pos, case.ratio, cap);
            let entries: Vec<usize> = if case.ratio == 4 {
                (0..n.min(k)).map(|j| sel[r * k + j] as usize).collect()
            } else {
                (0..n).collect()
            };
            keys.extend(
                entries
                    .iter()
                    .map(|&e| &comp[(slot * cap + e) * DIM..][..DIM]),
            );
        }
        for h in 0..HEADS {
            let want = reference_head(
                &q[(r * HEADS + h) * DIM..][..DIM],
                &keys,
                sink[h],
                &freqs,
                pos,
            );
            let (g, hh) = (h / hpg, h % hpg);
            let base = (g * rows + r) * hpg * DIM + hh * DIM;
            let amax = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            for c in 0..DIM {
                let e = (got[base + c].to_f32() - want[c]).abs();
                // bf16 output (2^-9 relative) plus f32-level accumulation error over the row.
                let bound = want[c].abs() * 2f32.powi(-8) + 1e-4 * amax + 1e-30;
                worst = worst.max(e / bound);
            }
        }
    }
    println!(
        "sparse attention ratio {} k {} rows {rows} splits {splits}: worst {worst:.3} of the bound",
        case.ratio, case.k
    );
    assert!(
        worst <= 1.0,
        "ratio {} positions {:?}",
        case.ratio,
        case.positions
    );
}

#[test]
fn sparse_attention_full_size_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let cases = [
        // CSA at 4K: 128 window rows + 512 selected entries, batch-1 splits (64) and a few.
        Case {
            ratio: 4,
            k: 512,
            positions: vec![4095],
            splits: 64,
        },
        Case {
            ratio: 4,
            k: 512,
            positions: vec![4095, 700, 37],
            splits: 3,
        },
        // One split walking all 20 tiles (a partial last tile), and 9 splits of 3.
        Case {
            ratio: 4,
            k: 512,
            positions: vec![4095, 1000],
            splits: 1,
        },
        Case {
            ratio: 4,
            k: 512,
            positions: vec![4095, 2999, 517],
            splits: 9,
        },
        // HCA: every live entry (32 at 4K), window only.
        Case {
            ratio: 128,
            k: 0,
            positions: vec![4095, 130],
            splits: 7,
        },
        Case {
            ratio: 128,
            k: 0,
            positions: vec![4095, 6000],
            splits: 2,
        },
        Case {
            ratio: 0,
            k: 0,
            positions: vec![5000, 3],
            splits: 64,
        },
    ];
    for c in &cases {
        run_attention(&ctx, c);
    }
}

#[test]
fn index_scores_full_size_match_cpu() {
    let Some(ctx) = gpu() else { return };
    let s = &ctx.stream;
    let (heads, dim, ratio, k) = (64usize, 128usize, 4usize, 512usize);
    let (cap, positions) = (1100usize, vec![3999i32, 2100]);
    let rows = positions.len();
    let slots = rows + 1;
    let q = bf16s(rows * heads * dim, 11, 1.0);
    let keys = bf16s(slots * cap * dim, 12, 1.0);
    let stride = heads + 5;
    let wts: Vec<f32> = (0..rows * stride).map(|i| rnd(i, 13)).collect();
    let slot_ids: Vec<i32> = (0..rows as i32).map(|r| rows as i32 - r).collect();
    let (dq, dk, dw) = (
        s.clone_htod(&q).expect("q"),
        s.clone_htod(&keys).expect("keys"),
        s.clone_htod(&wts).expect("wts"),
    );
    let (dslots, dpos) = (
        s.clone_htod(&slot_ids).expect("slots"),
        s.clone_htod(&positions).expect("pos"),
    );
    let mut scores = s.clone_htod(&vec![f32::NAN; slots * cap]).expect("scores");
    let scale = ((dim * heads) as f32).powf(-0.5);
    let p = AttnIndexScore {
        core: IndexScoreCore {
            q: addr(&ctx, &dq),
            wts: addr(&ctx, &dw),
            keys: addr(&ctx, &dk),
            slots: addr(&ctx, &dslots),
            positions: addr(&ctx, &dpos),
            scores: addr_mut(&ctx, &mut scores),
            wts_stride: stride as i32,
            heads: heads as i32,
            dim: dim as i32,
            cap: cap as i32,
            ratio: ratio as i32,
            k: k as i32,
        },
        scale,
        pad: 0,
    };
    // SAFETY: q rows x heads x dim, wts rows x stride, keys [slots, cap, dim], scores [slots, cap].
    unsafe { ctx.launch_attn_index_score(s, 264, rows, &p) }.expect("score");
    let got = s.clone_dtoh(&scores).expect("dtoh");
    let mut worst = 0f64;
    for (r, &pos) in positions.iter().enumerate() {
        let slot = slot_ids[r] as usize;
        let n = ((pos as usize + 1) / ratio).min(cap);
        for w in 0..n {
            let (mut want, mut mag) = (0f64, 0f64);
            for h in 0..heads {
                let wt = f64::from(wts[r * stride + h]) * f64::from(scale);
                let (mut d, mut dm) = (0f64, 0f64);
                for c in 0..dim {
                    let t = q[(r * heads + h) * dim + c].to_f64()
                        * keys[(slot * cap + w) * dim + c].to_f64();
                    d += t;
                    dm += t.abs();
                }
                want += wt * d.max(0.0);
                mag += wt.abs() * dm;
            }
            let e = (f64::from(got[slot * cap + w]) - want).abs() / (1e-5 * mag + 1e-30);
            worst = worst.max(e);
        }
    }
    println!("index scores 64 x 128, n 1000 / 525: worst {worst:.3} of the bound");
    assert!(worst <= 1.0);
}

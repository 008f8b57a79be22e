//! `kbench fp4 [B,..]`: the routed-expert GEMV (fp4_expert) at the decode step's launches: w1 alone (the
//! first notes' row), the w1+w3 pair in one launch (what the step issues for the up projection) and w2 (x per
//! slot). 256 experts, top-6, ids rotated over 8 sets so that L2 holds no weights; the grouping (`moe_group`)
//! of every set is made once up front, so the rows time the expert launch alone, except "+group", which
//! launches moe_group before each call as the first notes did. `kbench fp4prof [B,..]`: one launch of each
//! default shape per batch, for ncu.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, moe_group_meta_len, ExpertShape, Fp4Mat, Fp4Tune, GemvOut, GpuContext};

use super::{filled, time_ms, R};

const EXPERTS: usize = 256;
const TOPK: usize = 6;
const SETS: usize = 8;

/// Pseudo-random bytes, 8 at a time (the banks are ~1 GB each).
fn noise64(g: &GpuContext, n: usize, seed: u64, mask: u8) -> R<CudaSlice<u8>> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let m = u64::from_ne_bytes([mask; 8]);
    let mut v = Vec::with_capacity(n.next_multiple_of(8));
    while v.len() < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.extend_from_slice(&(s & m).to_ne_bytes());
    }
    v.truncate(n);
    Ok(g.stream.clone_htod(&v)?)
}

/// Expert ids for `b` tokens: distinct per token, spread like a router would; `set` shifts them so that
/// rotating over sets keeps the weights out of L2 even at batch 1.
fn expert_ids(b: usize, set: usize) -> Vec<i32> {
    (0..b * TOPK)
        .map(|i| (((i / TOPK) * 37 + (i % TOPK) * 41 + set * 32) % EXPERTS) as i32)
        .collect()
}

/// One or two expert matrices of one shape (w, scales).
struct Bank {
    w: Vec<CudaSlice<u8>>,
    s: Vec<CudaSlice<u8>>,
    n: usize,
    k: usize,
}

impl Bank {
    fn new(g: &GpuContext, n: usize, k: usize, mats: usize, seed: u64) -> R<Self> {
        let (mut w, mut s) = (Vec::new(), Vec::new());
        for m in 0..mats as u64 {
            w.push(noise64(g, EXPERTS * n * k / 2, seed + 2 * m, 0xff)?);
            s.push(noise64(g, EXPERTS * n * k / 32, seed + 2 * m + 1, 0x0f)?);
        }
        Ok(Bank { w, s, n, k })
    }
}

/// One batch of one shape: ids and groupings of every set, x, outputs.
struct Case {
    shape: ExpertShape,
    ids: Vec<CudaSlice<i32>>,
    metas: Vec<CudaSlice<i32>>,
    meta: CudaSlice<i32>,
    x: CudaSlice<bf16>,
    y: Vec<CudaSlice<bf16>>,
    distinct: usize,
}

impl Case {
    fn new(g: &GpuContext, bank: &Bank, b: usize, per_slot: bool) -> R<Self> {
        let shape = ExpertShape {
            b,
            topk: TOPK,
            experts: EXPERTS,
            n: bank.n,
            k: bank.k,
            x_per_slot: per_slot,
        };
        let mut first = expert_ids(b, 0);
        first.sort_unstable();
        first.dedup();
        let ids = (0..SETS)
            .map(|r| Ok(g.stream.clone_htod(&expert_ids(b, r))?))
            .collect::<R<Vec<_>>>()?;
        let mut metas = Vec::new();
        for d in &ids {
            let mut m = filled(g, moe_group_meta_len(b * TOPK), 0i32)?;
            g.launch_moe_group(&g.stream, &shape, d, &mut m)?;
            metas.push(m);
        }
        let xrows = if per_slot { b * TOPK } else { b };
        let y = (0..bank.w.len())
            .map(|_| filled(g, b * TOPK * bank.n, bf16::ZERO))
            .collect::<R<Vec<_>>>()?;
        Ok(Case {
            shape,
            ids,
            metas,
            meta: filled(g, moe_group_meta_len(b * TOPK), 0i32)?,
            x: filled(g, xrows * bank.k, bf16::from_f32(0.5))?,
            y,
            distinct: first.len(),
        })
    }

    /// Weight + scale bytes of the distinct experts of all matrices, plus x and the outputs.
    fn bytes(&self, bank: &Bank) -> f64 {
        let (n, k, m) = (bank.n, bank.k, bank.w.len());
        let xrows = if self.shape.x_per_slot {
            self.shape.b * TOPK
        } else {
            self.shape.b
        };
        (m * self.distinct * (n * k / 2 + n * k / 32)
            + 2 * xrows * k
            + m * 2 * self.shape.b * TOPK * n) as f64
    }

    /// One launch over the grouping `set` (`group`: run moe_group first, into the scratch meta).
    fn launch(
        &mut self,
        g: &GpuContext,
        bank: &Bank,
        kernel: Kernel,
        tune: Fp4Tune,
        set: usize,
        group: bool,
    ) -> R<()> {
        let set = set % SETS;
        if group {
            g.launch_moe_group(&g.stream, &self.shape, &self.ids[set], &mut self.meta)?;
        }
        let meta = if group { &self.meta } else { &self.metas[set] };
        let mut outs = self.y.iter_mut();
        let mut mat = |i: usize| -> Option<Fp4Mat<'_, CudaSlice<u8>>> {
            let out = outs.next()?;
            Some(Fp4Mat {
                w: &bank.w[i],
                scale: &bank.s[i],
                out: GemvOut::bf16(out, &g.stream),
            })
        };
        let mats = [mat(0), mat(1)];
        let (s, x) = (&g.stream, &self.x);
        match (kernel, mats) {
            (Kernel::Generic, mats) => {
                g.launch_fp4_expert_generic(s, &self.shape, x, mats, meta, tune)?
            }
            (Kernel::Auto, [Some(a), Some(b)]) => {
                g.launch_fp4_expert_pair(s, &self.shape, x, [a, b], meta, Some(tune))?
            }
            (Kernel::Auto, [Some(a), None]) => {
                g.launch_fp4_expert_tuned(s, &self.shape, x, a.w, a.scale, meta, a.out, tune)?
            }
            _ => return Err("no matrix".into()),
        }
        Ok(())
    }
}

/// The three decode launches: (name, N, K, x per slot, matrices).
const SHAPES: [(&str, usize, usize, bool, usize); 3] = [
    ("w1", 2048, 4096, false, 1),
    ("w1+w3", 2048, 4096, false, 2),
    ("w2", 4096, 2048, true, 1),
];

/// Which kernel a timed launch runs.
#[derive(Clone, Copy)]
enum Kernel {
    /// What the launchers pick (a fixed-size kernel where one matches the shape).
    Auto,
    /// fp4_expert_mtM whatever the shape.
    Generic,
}

/// The kernels timed per shape: (label, kernel, rows per warp). All three give the same bits.
const VARIANTS: [(&str, Kernel, usize); 3] = [
    ("default", Kernel::Auto, 2),
    ("generic mt2", Kernel::Generic, 2),
    ("generic mt1", Kernel::Generic, 1),
];

pub fn bench(g: &GpuContext, copy: f64, batches: &[usize]) -> R<()> {
    println!("| launch | B | experts | kernel | kw mt | us | GB/s | of copy |\n|---|---|---|---|---|---|---|---|");
    let w13 = Bank::new(g, 2048, 4096, 2, 11)?;
    let w2 = Bank::new(g, 4096, 2048, 1, 21)?;
    let single = Bank {
        w: vec![w13.w[0].clone()],
        s: vec![w13.s[0].clone()],
        n: 2048,
        k: 4096,
    };
    for (name, _, _, per_slot, mats) in SHAPES {
        let bank = match (name, mats) {
            ("w2", _) => &w2,
            (_, 2) => &w13,
            _ => &single,
        };
        for &b in batches {
            let mut c = Case::new(g, bank, b, per_slot)?;
            let bytes = c.bytes(bank);
            let dflt = Fp4Tune::for_shape(&c.shape);
            let mut rows = vec![("default +group", Kernel::Auto, 2usize, true, dflt.kw)];
            rows.extend(
                VARIANTS
                    .iter()
                    .map(|&(l, k, mt)| (l, k, mt, false, dflt.kw)),
            );
            // The other K split on the generic kernel (blocks of other heights: how the last wave fills).
            let other_kw = if dflt.kw == 4 { 2 } else { 4 };
            rows.push(("generic mt2", Kernel::Generic, 2, false, other_kw));
            rows.push(("generic mt1", Kernel::Generic, 1, false, other_kw));
            for (label, kernel, mt, group, kw) in rows {
                let tune = Fp4Tune { kw, mt };
                let ms = time_ms(g, 20, |i| c.launch(g, bank, kernel, tune, i, group))?;
                let gbs = bytes / ms / 1e6;
                println!(
                    "| fp4 {name} | {b:>2} | {:>3} | {label} | kw{} mt{} | {:>8.2} | {gbs:>7.0} | {:>5.1}% |",
                    c.distinct,
                    tune.kw,
                    tune.mt,
                    ms * 1e3,
                    100.0 * gbs / copy
                );
            }
        }
    }
    Ok(())
}

/// One launch of each variant of the w1+w3 and w2 launches per batch (ids of the first set), for a profiler:
/// `ncu --kernel-name regex:fp4 kbench fp4prof 1,8`.
pub fn prof(g: &GpuContext, batches: &[usize]) -> R<()> {
    let w13 = Bank::new(g, 2048, 4096, 2, 11)?;
    let w2 = Bank::new(g, 4096, 2048, 1, 21)?;
    for &b in batches {
        for (name, _, _, per_slot, _) in SHAPES.iter().skip(1) {
            let bank = if *name == "w2" { &w2 } else { &w13 };
            let mut c = Case::new(g, bank, b, *per_slot)?;
            let dflt = Fp4Tune::for_shape(&c.shape);
            for (label, kernel, mt) in VARIANTS {
                let tune = Fp4Tune { kw: dflt.kw, mt };
                c.launch(g, bank, kernel, tune, 0, false)?;
                g.stream.synchronize()?;
                println!("fp4prof: {name} B={b} {label}");
            }
        }
    }
    Ok(())
}

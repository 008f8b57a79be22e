//! `kbench pfattn [ROWS,..]`: every prefill attention kernel kind (`PF_ATTN_KINDS`) on one sequence prefilled
//! from position 0 at the model's shapes (64 heads, dim 512, rdim 64, window 128, groups 8): CSA (ratio 4,
//! 512 random distinct entries per row out of the (pos + 1) / 4 complete ones), HCA (ratio 128, all entries)
//! and SWA. Prints us per launch, the 43-layer sum (21 CSA + 20 HCA + 2 SWA layers) and each kind's worst
//! difference from kind 0 in units of the GPU test's bound (NaN: not compared). `kbench pfattn-once ROWS`:
//! one CSA launch per kind (for ncu).
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfAttn, PF_ATTN_KINDS};
use dsv4_kernels::{bf16, GpuContext};

use super::{time_ms, R};

const HEADS: usize = 64;
const DIM: usize = 512;
const WINDOW: usize = 128;
const TOPK: usize = 512;

/// Layer types: (name, ratio, CSA selection, layers of the model).
const LAYERS: [(&str, usize, bool, usize); 3] = [
    ("CSA", 4, true, 21),
    ("HCA", 128, false, 20),
    ("SWA", 0, false, 2),
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `n` bf16 values in [-1, 1): a random pool of 1M values repeated (host time stays small at 8K rows).
fn values(g: &GpuContext, r: &mut Rng, n: usize) -> R<CudaSlice<u16>> {
    let pool: Vec<u16> = (0..1 << 20)
        .map(|_| bf16::from_f32(r.unit()).to_bits())
        .collect();
    let v: Vec<u16> = pool.iter().copied().cycle().take(n).collect();
    Ok(g.stream.clone_htod(&v)?)
}

/// CSA selection of `rows` rows at positions 0..rows: row i picks min(n, TOPK) distinct entries of 0..n,
/// n = (i + 1) / 4, by a partial Fisher-Yates shuffle (indices >= n are never touched, so `all` keeps 0..n as a
/// permutation while n grows).
fn selection(r: &mut Rng, rows: usize, cap: usize) -> Vec<i32> {
    let mut all: Vec<i32> = (0..cap as i32).collect();
    let mut sel = vec![0i32; rows * TOPK];
    for i in 0..rows {
        let n = ((i + 1) / 4).min(cap);
        for j in 0..n.min(TOPK) {
            let t = j + (r.next() % (n - j) as u64) as usize;
            all.swap(j, t);
            sel[i * TOPK + j] = all[j];
        }
    }
    sel
}

fn dptr<T>(g: &GpuContext, b: &CudaSlice<T>) -> u64 {
    use dsv4_kernels::cudarc::driver::DevicePtr;
    b.device_ptr(&g.stream).0
}

/// Device buffers of one `rows`-row call; `p` addresses them (layer fields set per launch).
struct Call {
    _bufs: Vec<CudaSlice<u16>>,
    _ints: Vec<CudaSlice<i32>>,
    _floats: Vec<CudaSlice<f32>>,
    out: CudaSlice<u16>,
    p: PfAttn,
    /// Compressed entries per layer type (cap of the cache).
    caps: [usize; 3],
    sel: u64,
    comp: u64,
}

fn setup(g: &GpuContext, rows: usize) -> R<Call> {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let caps = [rows / 4, rows / 128, 0];
    let q = values(g, &mut r, rows * HEADS * DIM)?;
    let kv = values(g, &mut r, rows * DIM)?;
    let ring = values(g, &mut r, WINDOW * DIM)?;
    let comp = values(g, &mut r, caps[0].max(1) * DIM)?;
    let sel = g.stream.clone_htod(&selection(&mut r, rows, caps[0]))?;
    let zeros = g.stream.clone_htod(&vec![0i32; rows])?;
    let pos: Vec<i32> = (0..rows as i32).collect();
    let positions = g.stream.clone_htod(&pos)?;
    let sink: Vec<f32> = (0..HEADS).map(|_| r.unit()).collect();
    let freqs: Vec<f32> = (0..32).map(|i| 0.9f32.powi(i)).collect();
    let (sink, freqs) = (g.stream.clone_htod(&sink)?, g.stream.clone_htod(&freqs)?);
    let out = g.stream.clone_htod(&vec![0u16; rows * HEADS * DIM])?;
    let p = PfAttn {
        q: dptr(g, &q),
        kv: dptr(g, &kv),
        ring: dptr(g, &ring),
        slots: dptr(g, &zeros),
        positions: dptr(g, &positions),
        row0: dptr(g, &zeros),
        pos0: dptr(g, &zeros),
        sink: dptr(g, &sink),
        freqs: dptr(g, &freqs),
        out: dptr(g, &out),
        heads: HEADS as i32,
        dim: DIM as i32,
        window: WINDOW as i32,
        k: TOPK as i32,
        rdim: 64,
        groups: 8,
        rows: rows as i32,
        scale: (DIM as f32).powf(-0.5),
        ..Default::default()
    };
    Ok(Call {
        sel: dptr(g, &sel),
        comp: dptr(g, &comp),
        _bufs: vec![q, kv, ring, comp],
        _ints: vec![sel, zeros, positions],
        _floats: vec![sink, freqs],
        out,
        p,
        caps,
    })
}

impl Call {
    /// The parameter block of layer type `l` (index into LAYERS).
    fn layer(&self, l: usize) -> PfAttn {
        let (_, ratio, csa, _) = LAYERS[l];
        PfAttn {
            ratio: ratio as i32,
            cap: self.caps[l] as i32,
            comp: if ratio > 0 { self.comp } else { 0 },
            sel: if csa { self.sel } else { 0 },
            ..self.p
        }
    }
}

fn kinds(g: &GpuContext) -> Vec<usize> {
    (0..PF_ATTN_KINDS.len())
        .filter(|&k| g.kernels.prefill.attn_fits[k][3])
        .collect()
}

/// Worst |a - b| / (1e-3 + |b| 2^-8) (the GPU test's bound, b = kind 0's output).
fn worst(a: &[u16], b: &[u16]) -> f32 {
    let f = |x: u16| bf16::from_bits(x).to_f32();
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f(x) - f(y)).abs() / (1e-3 + f(y).abs() * 2f32.powi(-8)))
        .fold(0.0, f32::max)
}

pub fn bench(g: &GpuContext, rows: &[usize]) -> R<()> {
    println!("| rows | layer | kind | us | worst vs kind 0 |\n|---|---|---|---|---|");
    for &m in rows {
        let c = setup(g, m)?;
        let mut total = vec![0.0f64; PF_ATTN_KINDS.len()];
        for (l, &(name, _, _, layers)) in LAYERS.iter().enumerate() {
            let p = c.layer(l);
            let mut base: Option<Vec<u16>> = None;
            for k in kinds(g) {
                let ms = time_ms(g, 3, |_| {
                    // SAFETY: setup sized every buffer for m rows at these shapes (comp: caps[0] entries).
                    Ok(unsafe { g.launch_pf_attn_kind(&g.stream, k, &p) }?)
                })?;
                // Outputs compared at every size for CSA (the top-512 cap binds past 2K rows), else up to 4K.
                let w = if l == 0 || m <= 4096 {
                    let got = g.stream.clone_dtoh(&c.out)?;
                    let w = base.as_ref().map_or(0.0, |b| worst(&got, b));
                    base.get_or_insert(got);
                    w
                } else {
                    f32::NAN
                };
                total[k] += ms * layers as f64;
                println!(
                    "| {m} | {name} | {} | {:.1} | {w:.3} |",
                    PF_ATTN_KINDS[k],
                    ms * 1e3
                );
            }
        }
        for k in kinds(g) {
            println!(
                "| {m} | 43 layers | {} | {:.1} | - |",
                PF_ATTN_KINDS[k],
                total[k] * 1e3
            );
        }
    }
    Ok(())
}

/// One CSA launch of `rows` rows per kind, synchronised (for `ncu --kernel-name regex:pf_attn`).
pub fn once(g: &GpuContext, rows: usize) -> R<()> {
    let c = setup(g, rows)?;
    let p = c.layer(0);
    for k in kinds(g) {
        // SAFETY: as in `bench`.
        unsafe { g.launch_pf_attn_kind(&g.stream, k, &p) }?;
        g.stream.synchronize()?;
    }
    Ok(())
}

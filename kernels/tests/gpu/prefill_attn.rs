//! Prefill attention, compressor pooling + state, and the ring write against the CPU references (the indexer
//! scores: prefill_index.rs), on calls of several sequences (segments) that start mid-window with history in the ring and
//! the compressor state, odd lengths, single-token segments.
use dsv4_kernels::attn::{CompressHead, CompressTail};
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfAttn, PfCompress, PfRing, PF_ATTN_DIMS, PF_ATTN_KINDS};
use dsv4_kernels::reference::prefill::{
    compress_decode, rmsnorm_f32, sparse_attention, CompShape, PfAttnShape, PfRows,
};
use dsv4_kernels::{bf16, GpuContext};
use rand::Rng;

use crate::common::*;
use crate::prefill_gemm::dp;

/// Rows of a call feeding `(slot, pos0, len)` segments in order.
pub(crate) fn rows_of(segs: &[(usize, usize, usize)]) -> PfRows {
    let mut r = PfRows::default();
    let mut row = 0;
    for &(slot, p0, len) in segs {
        for i in 0..len {
            r.slots.push(slot as i32);
            r.positions.push((p0 + i) as i32);
            r.row0.push(row as i32);
            r.pos0.push(p0 as i32);
        }
        row += len;
    }
    r
}

fn to_f32(v: &[u16]) -> Vec<f32> {
    v.iter().map(|&b| bf16::from_bits(b).to_f32()).collect()
}

pub(crate) fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Distinct random entries < n, min(n, k) of them, for every row (the CSA selection).
fn rand_sel(
    r: &mut rand::rngs::StdRng,
    rows: &PfRows,
    ratio: usize,
    cap: usize,
    k: usize,
) -> Vec<i32> {
    let mut sel = vec![0i32; rows.positions.len() * k];
    for (i, &pos) in rows.positions.iter().enumerate() {
        let n = ((pos as usize + 1) / ratio).min(cap);
        let mut all: Vec<i32> = (0..n as i32).collect();
        for j in 0..n.min(k) {
            let t = r.random_range(j..n);
            all.swap(j, t);
            sel[i * k + j] = all[j];
        }
    }
    sel
}

fn attn_case(
    g: &GpuContext,
    seed: u64,
    sh: PfAttnShape,
    segs: &[(usize, usize, usize)],
    csa: bool,
) {
    let mut r = rng(seed);
    let rows = rows_of(segs);
    let n = rows.positions.len();
    let slots = segs.iter().map(|s| s.0).max().unwrap_or(0) + 1;
    let (h, d) = (sh.heads, sh.dim);
    let q = rand_bf16(&mut r, n * h * d);
    let kv = rand_bf16(&mut r, n * d);
    let ring = rand_bf16(&mut r, slots * sh.window * d);
    let comp = rand_bf16(&mut r, slots * sh.cap.max(1) * d);
    let sink: Vec<f32> = (0..h).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let freqs: Vec<f32> = (0..sh.rdim / 2)
        .map(|_| r.random_range(0.0f32..1.0))
        .collect();
    let sel = if csa {
        rand_sel(&mut r, &rows, sh.ratio, sh.cap, sh.k)
    } else {
        vec![0]
    };
    let want = sparse_attention(
        &sh,
        &rows,
        &q,
        &kv,
        &ring,
        &comp,
        csa.then_some(&sel[..]),
        &sink,
        &freqs,
    );
    let up = |v: &[bf16]| upload(g, &bits(v));
    let (dq, dkv, dring, dcomp) = (up(&q), up(&kv), up(&ring), up(&comp));
    let (dsl, dpos, dr0, dp0) = (
        upload(g, &rows.slots),
        upload(g, &rows.positions),
        upload(g, &rows.row0),
        upload(g, &rows.pos0),
    );
    let (dsel, dsink, dfreq) = (upload(g, &sel), upload(g, &sink), upload(g, &freqs));
    let mut p = PfAttn {
        q: dp(g, &dq),
        kv: dp(g, &dkv),
        ring: dp(g, &dring),
        comp: if sh.ratio > 0 { dp(g, &dcomp) } else { 0 },
        sel: if csa { dp(g, &dsel) } else { 0 },
        slots: dp(g, &dsl),
        positions: dp(g, &dpos),
        row0: dp(g, &dr0),
        pos0: dp(g, &dp0),
        sink: dp(g, &dsink),
        freqs: dp(g, &dfreq),
        out: 0,
        heads: h as i32,
        dim: d as i32,
        window: sh.window as i32,
        ratio: sh.ratio as i32,
        cap: sh.cap as i32,
        k: sh.k as i32,
        rdim: sh.rdim as i32,
        groups: sh.groups as i32,
        rows: n as i32,
        scale: sh.scale,
    };
    // Every kernel kind the device can run, each into a fresh NaN-filled output.
    let di = PF_ATTN_DIMS.iter().position(|&x| x == d).expect("dim");
    for kind in (0..PF_ATTN_KINDS.len()).filter(|&k| g.kernels.prefill.attn_fits[k][di]) {
        let out: CudaSlice<u16> = upload(g, &vec![0xffffu16; n * h * d]);
        p.out = dp(g, &out);
        // SAFETY: every buffer above has the extents prefill_attn.cu documents for n rows and these shapes.
        unsafe { g.launch_pf_attn_kind(&g.stream, kind, &p) }.expect("launch");
        let got = to_f32(&download(g, &out));
        // P is f32-accurate (hi + lo bf16 parts); the output is rounded to bf16 (half an ulp: 2^-9 relative).
        let (worst, at) = worst_ratio(&got, &want, |i| 1e-3 + want[i].abs() * 2f32.powi(-8));
        let rel = rel_l2(&got, &want);
        let name = PF_ATTN_KINDS[kind];
        println!(
            "{name} heads {h} dim {d} ratio {} csa {csa} rows {n}: rel_l2 {rel:.2e}, worst/bound {worst:.3} at {at}",
            sh.ratio
        );
        assert!(
            worst <= 1.0 && rel < 1e-2,
            "{name} element {at}: got {} want {}",
            got[at],
            want[at]
        );
    }
}

fn shape(
    heads: usize,
    dim: usize,
    ratio: usize,
    cap: usize,
    k: usize,
    groups: usize,
) -> PfAttnShape {
    PfAttnShape {
        heads,
        dim,
        window: 16,
        ratio,
        cap,
        k,
        rdim: 32.min(dim),
        groups,
        scale: (dim as f32).powf(-0.5),
    }
}

#[test]
fn pf_attention_matches_reference() {
    let Some(g) = gpu() else { return };
    // Segments start at 0, mid-window with ring history, past the window, and single-token (decode) rows.
    let segs = [(0, 0, 37), (2, 21, 9), (1, 100, 1), (3, 5, 2)];
    attn_case(&g, 1, shape(4, 128, 0, 0, 8, 2), &segs, false);
    attn_case(&g, 2, shape(4, 128, 4, 64, 8, 2), &segs, true);
    attn_case(&g, 3, shape(4, 128, 8, 32, 8, 2), &segs, false);
    attn_case(
        &g,
        4,
        shape(64, 512, 4, 64, 20, 8),
        &[(0, 40, 33), (1, 3, 1)],
        true,
    );
    attn_case(&g, 5, shape(70, 64, 8, 40, 8, 2), &[(1, 7, 19)], false);
    attn_case(&g, 6, shape(16, 256, 128, 4, 8, 4), &[(0, 250, 70)], false);
    // The real window (128) and head count: rows crossing the window edge (positions 100..169, the ring
    // holding 0..99), key counts that are no multiple of the 32-key tile (128 + 37 selected; 128 + 1 HCA).
    let real = |ratio, cap, k| PfAttnShape {
        window: 128,
        rdim: 64,
        ..shape(64, 512, ratio, cap, k, 8)
    };
    attn_case(&g, 7, real(4, 64, 37), &[(0, 100, 70), (1, 0, 3)], true);
    attn_case(&g, 8, real(128, 2, 8), &[(1, 120, 50)], false);
    attn_case(&g, 9, real(0, 0, 8), &[(0, 126, 5), (2, 0, 130)], false);
}

/// A compressor's call: host decode emulation vs pf_compress_pool + pf_compress_state.
fn compress_case(g: &GpuContext, seed: u64, cs: CompShape, segs: &[(usize, usize, usize)]) {
    let mut r = rng(seed);
    let (m, w, srows) = (cs.ratio, cs.width(), cs.srows());
    let slots = segs.len();
    let cap = 64;
    let ape: Vec<f32> = (0..m * w).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let norm: Vec<f32> = (0..cs.dc).map(|_| r.random_range(0.5f32..1.5)).collect();
    let rows = rows_of(segs);
    let n = rows.positions.len();
    let (stride, kv_off, gate_off) = (2 * w + 5, 3, 3 + w);
    let proj: Vec<f32> = (0..n * stride)
        .map(|_| r.random_range(-2.0f32..2.0))
        .collect();
    // Each slot's state after feeding its prefix (positions 0..pos0) one token at a time.
    let mut states = Vec::new();
    let mut want_entries = Vec::new();
    let mut row = 0;
    for &(_, p0, len) in segs {
        let mut st = cs.fresh();
        let pre_k: Vec<f32> = (0..p0 * w).map(|_| r.random_range(-2.0f32..2.0)).collect();
        let pre_g: Vec<f32> = (0..p0 * w).map(|_| r.random_range(-2.0f32..2.0)).collect();
        compress_decode(&cs, &mut st, 0, &pre_k, &pre_g, &ape);
        let before = st.clone();
        let call = |off: usize| -> Vec<f32> {
            (row..row + len)
                .flat_map(|i| proj[i * stride + off..i * stride + off + w].iter().copied())
                .collect()
        };
        let entries = compress_decode(&cs, &mut st, p0, &call(kv_off), &call(gate_off), &ape);
        want_entries.push(entries);
        states.push((before, st));
        row += len;
    }
    let kv0: Vec<f32> = states.iter().flat_map(|s| s.0.kv.iter().copied()).collect();
    let sc0: Vec<f32> = states.iter().flat_map(|s| s.0.sc.iter().copied()).collect();
    let (dkv, dsc) = (upload(g, &kv0), upload(g, &sc0));
    let cache: CudaSlice<u16> = upload(g, &vec![0u16; slots * cap * cs.dc]);
    let mut jobs = Vec::new();
    let mut segs4 = Vec::new();
    let mut row = 0;
    for (slot, &(_, p0, len)) in segs.iter().enumerate() {
        for wi in p0 / m..(p0 + len) / m {
            jobs.extend([slot as i32, wi as i32, row as i32, p0 as i32]);
        }
        segs4.extend([slot as i32, row as i32, p0 as i32, len as i32]);
        row += len;
    }
    let (dproj, dape, dnorm) = (upload(g, &proj), upload(g, &ape), upload(g, &norm));
    let (djobs, dsegs) = (upload(g, &jobs), upload(g, &segs4));
    let head = CompressHead {
        proj: dp(g, &dproj),
        ape: dp(g, &dape),
        norm_w: dp(g, &dnorm),
        freqs: dp(g, &dnorm),
    };
    let tail = CompressTail {
        state_kv: dp(g, &dkv),
        state_sc: dp(g, &dsc),
        cache: dp(g, &cache),
        proj_stride: stride as i32,
        kv_off: kv_off as i32,
        gate_off: gate_off as i32,
        dc: cs.dc as i32,
        ratio: m as i32,
        overlap: i32::from(cs.overlap),
        rdim: 0,
        quant: 0,
        cap: cap as i32,
        eps: 1e-6,
    };
    let mut p = PfCompress {
        head,
        jobs: dp(g, &djobs),
        tail,
    };
    // SAFETY: proj n x stride, ape m x w, state [slots, srows, w], cache [slots, cap, dc], jobs x 4 ints.
    unsafe { g.launch_pf_compress_pool(&g.stream, jobs.len() / 4, &p) }.expect("pool");
    p.jobs = dp(g, &dsegs);
    // SAFETY: as above with the segment table.
    unsafe { g.launch_pf_compress_state(&g.stream, slots, &p) }.expect("state");
    let (gkv, gsc, gc) = (
        download(g, &dkv),
        download(g, &dsc),
        to_f32(&download(g, &cache)),
    );
    let per = srows * w;
    let mut entries = 0;
    for (slot, (st, ents)) in states.iter().zip(&want_entries).enumerate() {
        assert!(
            gkv[slot * per..(slot + 1) * per] == st.1.kv[..],
            "slot {slot}: kappa state differs from decode"
        );
        let same_g = gsc[slot * per..(slot + 1) * per]
            .iter()
            .zip(&st.1.sc)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same_g, "slot {slot}: gamma state differs from decode");
        for (wi, pooled) in ents {
            let want = rmsnorm_f32(pooled, &norm, 1e-6);
            let got = &gc[(slot * cap + wi) * cs.dc..][..cs.dc];
            for (c, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= b.abs() * 2f32.powi(-8) + 1e-5,
                    "slot {slot} entry {wi} ch {c}: {a} vs {b}"
                );
            }
            entries += 1;
        }
    }
    println!(
        "pf_compress ratio {m} overlap {}: {entries} entries and {slots} states match decode",
        cs.overlap
    );
}

#[test]
fn pf_compress_matches_decode_emulation() {
    let Some(g) = gpu() else { return };
    // Starts at 0, mid-window, right after a completed window, one token, windows completed in and before.
    let segs = [
        (0, 0, 37),
        (1, 13, 5),
        (2, 6, 2),
        (3, 8, 1),
        (4, 3, 1),
        (5, 4, 20),
    ];
    compress_case(
        &g,
        1,
        CompShape {
            ratio: 4,
            overlap: true,
            dc: 64,
        },
        &segs,
    );
    compress_case(
        &g,
        2,
        CompShape {
            ratio: 8,
            overlap: false,
            dc: 32,
        },
        &segs,
    );
    compress_case(
        &g,
        3,
        CompShape {
            ratio: 128,
            overlap: false,
            dc: 128,
        },
        &[(0, 120, 300), (1, 0, 128)],
    );
    compress_case(
        &g,
        4,
        CompShape {
            ratio: 4,
            overlap: true,
            dc: 512,
        },
        &[(0, 2, 11)],
    );
}

#[test]
fn pf_ring_write_matches_sequential_writes() {
    let Some(g) = gpu() else { return };
    let mut r = rng(5);
    let (window, dim) = (16, 64);
    let segs = [(0, 0, 37), (1, 13, 5), (2, 100, 1)];
    let rows = rows_of(&segs);
    let n = rows.positions.len();
    let kv = rand_bf16(&mut r, n * dim);
    let ring0 = rand_bf16(&mut r, 3 * window * dim);
    let mut want = bits(&ring0);
    for i in 0..n {
        let dst = (rows.slots[i] as usize * window + rows.positions[i] as usize % window) * dim;
        want[dst..dst + dim].copy_from_slice(&bits(&kv[i * dim..(i + 1) * dim]));
    }
    let seglen: Vec<i32> = segs.iter().flat_map(|s| vec![s.2 as i32; s.2]).collect();
    let dkv = upload(&g, &bits(&kv));
    let ring = upload(&g, &bits(&ring0));
    let (dsl, dpos, dp0, dlen) = (
        upload(&g, &rows.slots),
        upload(&g, &rows.positions),
        upload(&g, &rows.pos0),
        upload(&g, &seglen),
    );
    let p = PfRing {
        kv: dp(&g, &dkv),
        ring: dp(&g, &ring),
        slots: dp(&g, &dsl),
        positions: dp(&g, &dpos),
        pos0: dp(&g, &dp0),
        seglen: dp(&g, &dlen),
        dim: dim as i32,
        window: window as i32,
    };
    // SAFETY: kv n x dim, ring [3, window, dim], the per-row arrays n ints.
    unsafe { g.launch_pf_ring_write(&g.stream, n, &p) }.expect("ring");
    assert_eq!(
        download(&g, &ring),
        want,
        "ring differs from sequential writes"
    );
    println!("pf_ring_write: {n} rows");
}

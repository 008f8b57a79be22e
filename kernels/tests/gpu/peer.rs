//! The peer all-reduce (cuda/peer.cu, ops::peer) on two or more real GPUs against the CPU sum in rank
//! order, bit for bit on every rank: awkward lengths (tails, one block to the full grid, calls split into
//! several launches), eagerly, and captured into CUDA graphs replayed many times (the epoch in device
//! memory) with eager calls in between. SKIPs with fewer than two GPUs or without peer access.
use std::sync::Arc;

use dsv4_kernels::cudarc::driver::{sys, CudaSlice, CudaStream};
use dsv4_kernels::reference::split as refs;
use dsv4_kernels::{peer_access_possible, Gpu, GpuContext, PeerAllReduce, PEER_RANKS};
use rand::rngs::StdRng;
use rand::Rng;

use crate::common::*;

/// Up to PEER_RANKS contexts, one per GPU, or None after printing why the test is skipped.
fn peer_gpus() -> Option<Vec<Arc<GpuContext>>> {
    let n = Gpu::probe_all().map_or(0, |g| g.len());
    if n < 2 {
        eprintln!("SKIP: {n} GPU(s): the peer all-reduce needs two or more");
        return None;
    }
    let gpus: Vec<_> = (0..n.min(PEER_RANKS))
        .map(|i| Arc::new(GpuContext::new(i).expect("context")))
        .collect();
    if !peer_access_possible(&gpus).expect("peer probe") {
        eprintln!("SKIP: the GPUs have no peer access");
        return None;
    }
    Some(gpus)
}

/// Values over many magnitudes (so the order of the additions shows in the bits), some -0.0, and some
/// that cancel across ranks.
fn partials(r: &mut StdRng, world: usize, len: usize) -> Vec<Vec<f32>> {
    let mut v: Vec<Vec<f32>> = (0..world)
        .map(|_| {
            (0..len)
                .map(|_| match r.random_range(0..16) {
                    0 => -0.0,
                    _ => r.random_range(-3.0f32..3.0) * 2f32.powi(r.random_range(-24..24)),
                })
                .collect()
        })
        .collect();
    for i in (0..len).step_by(7) {
        v[world - 1][i] = -v[0][i];
    }
    v
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn upload_all(gpus: &[Arc<GpuContext>], host: &[Vec<f32>]) -> Vec<CudaSlice<f32>> {
    gpus.iter().zip(host).map(|(g, v)| upload(g, v)).collect()
}

/// Every rank's buffer equals the CPU rank-order sum of the first `n` (the rest untouched).
fn check(
    what: &str,
    gpus: &[Arc<GpuContext>],
    dev: &[CudaSlice<f32>],
    host: &[Vec<f32>],
    n: usize,
) {
    let mut want = host.to_vec();
    refs::rank_sum(&mut want, n);
    for (rank, (g, d)) in gpus.iter().zip(dev).enumerate() {
        let got = download(g, d);
        assert!(
            bits(&got) == bits(&want[rank]),
            "{what}: rank {rank} differs from the rank-order sum"
        );
    }
}

fn reduce(ar: &PeerAllReduce, dev: &mut [CudaSlice<f32>], n: usize) {
    let mut refs_mut: Vec<_> = dev.iter_mut().collect();
    ar.all_reduce_sum(&mut refs_mut, n).expect("all-reduce");
}

#[test]
fn peer_sum_matches_rank_order_sum() {
    let Some(gpus) = peer_gpus() else { return };
    let world = gpus.len();
    // A small cap splits the longer calls into several launches; the large one reaches the full grid.
    for cap in [10_000, 1 << 20] {
        let ar = PeerAllReduce::new(&gpus, cap).expect("peer all-reduce");
        let cases = [
            (1, 1),
            (5, 3),
            (4, 4),
            (9, 5),
            (2049, 2049),
            (4099, 4096),
            (10_003, 10_001),
            (25_003, 25_003),
            (262_147, 262_144),
            (300_001, 299_999),
            ((1 << 20) + 9, (1 << 20) + 7),
        ];
        for (i, (len, n)) in cases.into_iter().enumerate() {
            let mut r = rng(950 + i as u64);
            let host = partials(&mut r, world, len);
            let mut dev = upload_all(&gpus, &host);
            reduce(&ar, &mut dev, n);
            check(
                &format!("cap {cap}, len {len}, n {n}"),
                &gpus,
                &dev,
                &host,
                n,
            );
        }
    }
}

/// Begins capturing on every stream, runs `f`, ends every capture.
fn capture(
    streams: &[Arc<CudaStream>],
    f: impl FnOnce(),
) -> Vec<dsv4_kernels::cudarc::driver::CudaGraph> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    for s in streams {
        s.begin_capture(mode).expect("begin capture");
    }
    f();
    streams
        .iter()
        .map(|s| {
            s.end_capture(sys::CUgraphInstantiate_flags(0))
                .expect("end capture")
                .expect("a graph")
        })
        .collect()
}

#[test]
fn peer_sum_replays_in_graphs() {
    let Some(gpus) = peer_gpus() else { return };
    let world = gpus.len();
    let ar = PeerAllReduce::new(&gpus, 1 << 20).expect("peer all-reduce");
    // Two all-reduces per replay (two grids), and a third length run eagerly between replays.
    let (a, b, c) = (4099, 262_147, 33_333);
    let mut r = rng(970);
    let mut da = upload_all(&gpus, &partials(&mut r, world, a));
    let mut db = upload_all(&gpus, &partials(&mut r, world, b));
    let streams: Vec<_> = gpus.iter().map(|g| g.stream.clone()).collect();
    let graphs = capture(&streams, || {
        reduce(&ar, &mut da, a);
        reduce(&ar, &mut db, b);
    });
    for it in 0..40 {
        let ha = partials(&mut r, world, a);
        let hb = partials(&mut r, world, b);
        for (rank, g) in gpus.iter().enumerate() {
            g.stream
                .memcpy_htod(&ha[rank], &mut da[rank])
                .expect("upload");
            g.stream
                .memcpy_htod(&hb[rank], &mut db[rank])
                .expect("upload");
        }
        for g in &graphs {
            g.launch().expect("replay");
        }
        check(&format!("replay {it}, len {a}"), &gpus, &da, &ha, a);
        check(&format!("replay {it}, len {b}"), &gpus, &db, &hb, b);
        if it % 3 == 1 {
            let hc = partials(&mut r, world, c);
            let mut dc = upload_all(&gpus, &hc);
            reduce(&ar, &mut dc, c);
            check(&format!("eager after replay {it}"), &gpus, &dc, &hc, c);
        }
    }
}

#[test]
fn peer_sum_refuses_bad_buffers() {
    let Some(gpus) = peer_gpus() else { return };
    let ar = PeerAllReduce::new(&gpus, 4096).expect("peer all-reduce");
    let ok = vec![vec![1f32; 8]; gpus.len()];
    let mut dev = upload_all(&gpus, &ok);
    // A buffer shorter than the call, a missing rank, a buffer on another rank's GPU.
    assert!(ar
        .all_reduce_sum(&mut dev.iter_mut().collect::<Vec<_>>(), 9)
        .is_err());
    assert!(ar
        .all_reduce_sum(&mut dev.iter_mut().skip(1).collect::<Vec<_>>(), 8)
        .is_err());
    dev.swap(0, 1);
    assert!(ar
        .all_reduce_sum(&mut dev.iter_mut().collect::<Vec<_>>(), 8)
        .is_err());
    assert!(PeerAllReduce::new(&gpus[..1], 4096).is_err());
}

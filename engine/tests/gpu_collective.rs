//! The tensor split's collective between two real GPUs as the backend picks it
//! (`collective_for(.., Tensor, Peer)`): every rank's all-reduce equals the CPU sum in rank order bit for
//! bit, for messages within one peer launch and for longer ones (several launches, or NCCL where libnccl
//! is present: with two ranks its one addition gives the same bits). SKIPs with fewer than two GPUs or
//! without peer access.

use dsv4_engine::api::SplitMode;
use dsv4_engine::gpu::multi::load::contexts;
use dsv4_engine::gpu::multi::{collective_for, CollectiveKind};
use dsv4_engine::model::synth::SplitMix64;
use dsv4_kernels::reference::split::rank_sum;

fn gpu_count() -> usize {
    dsv4_kernels::Gpu::probe_all().map_or(0, |g| g.len())
}

#[test]
fn peer_sum_collective_matches_rank_order_sum() {
    let n = gpu_count();
    if n < 2 {
        eprintln!("SKIP: {n} GPU(s): the collective between GPUs needs two");
        return;
    }
    let gpus = contexts(&[0, 1]).expect("contexts");
    if !dsv4_kernels::peer_access_possible(&gpus).expect("peer probe") {
        eprintln!("SKIP: the GPUs have no peer access");
        return;
    }
    let comm = collective_for(&gpus, SplitMode::Tensor, CollectiveKind::Peer).expect("peer sum");
    assert_eq!(comm.name(), "peer sum");
    let mut rng = SplitMix64::new(31);
    for len in [4099, 1 << 20, (1 << 20) + 5, 3 * (1 << 20) + 1] {
        let mut host: Vec<Vec<f32>> = (0..2)
            .map(|_| {
                (0..len + 3)
                    .map(|_| rng.normalish() * (1u32 << rng.below(20)) as f32)
                    .collect()
            })
            .collect();
        let mut dev: Vec<_> = gpus
            .iter()
            .zip(&host)
            .map(|(g, v)| g.stream.clone_htod(v).expect("upload"))
            .collect();
        let mut refs: Vec<_> = dev.iter_mut().collect();
        comm.all_reduce_sum(&mut refs, len).expect("all-reduce");
        rank_sum(&mut host, len);
        for (rank, (g, d)) in gpus.iter().zip(&dev).enumerate() {
            let got = g.stream.clone_dtoh(d).expect("download");
            let same = got
                .iter()
                .zip(&host[rank])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "len {len}: rank {rank} differs from the rank-order sum"
            );
        }
    }
}

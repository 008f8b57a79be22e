//! Times the peer all-reduce (ops::peer) against NCCL between two GPUs of this process, alone: a CUDA graph
//! per GPU holding 86 all-reduces (a tensor-split decode step's count) of one message size, replayed; the
//! host clock over the replays after a sync (the GPUs share no event clock). Needs two GPUs with peer access
//! and libnccl. `cargo run --release -p dsv4-kernels --example peerbench [N,..]` (N: f32 per all-reduce;
//! default the decode's rows x 4096 at batch 1, 8 and 64, and 1M).
use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use dsv4_kernels::cudarc::driver::{sys, CudaGraph, CudaSlice, CudaStream};
use dsv4_kernels::cudarc::nccl::{self, Comm, ReduceOp};
use dsv4_kernels::{Gpu, GpuContext, PeerAllReduce};

type R<T> = Result<T, Box<dyn Error>>;

const CALLS: usize = 86;
const REPLAYS: usize = 50;

fn main() -> R<()> {
    let sizes: Vec<usize> = match std::env::args().nth(1) {
        Some(a) => a.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![4096, 8 * 4096, 64 * 4096, 1 << 20],
    };
    let n = Gpu::probe_all()?.len();
    if n < 2 {
        println!("peerbench needs two GPUs ({n} found)");
        return Ok(());
    }
    let gpus: Vec<Arc<GpuContext>> = (0..2)
        .map(|i| GpuContext::new(i).map(Arc::new))
        .collect::<Result<_, _>>()?;
    let streams: Vec<Arc<CudaStream>> = gpus.iter().map(|g| g.stream.clone()).collect();
    // The default grid (512 elements per block) and a 4x narrower one.
    let peers = [
        PeerAllReduce::new(&gpus, 1 << 20)?,
        PeerAllReduce::new(&gpus, 1 << 20)?.with_block_elems(2048),
    ];
    let comms = Comm::from_devices(streams.clone()).map_err(|e| format!("NCCL: {e:?}"))?;
    println!("| f32 per all-reduce | KB | peer us | peer, 2048 per block, us | NCCL us |");
    println!("|---|---|---|---|---|");
    for &len in &sizes {
        let mut bufs: Vec<CudaSlice<f32>> = streams
            .iter()
            .map(|s| s.alloc_zeros(len))
            .collect::<Result<_, _>>()?;
        let mut p = [0.0; 2];
        for (t, peer) in p.iter_mut().zip(&peers) {
            *t = time_graphs(&streams, || {
                let mut refs: Vec<_> = bufs.iter_mut().collect();
                for _ in 0..CALLS {
                    peer.all_reduce_sum(&mut refs, len)?;
                }
                Ok(())
            })?;
        }
        let c = time_graphs(&streams, || {
            for _ in 0..CALLS {
                nccl::group_start().map_err(|e| format!("{e:?}"))?;
                for (c, b) in comms.iter().zip(bufs.iter_mut()) {
                    c.all_reduce_in_place(&mut b.slice_mut(..len), &ReduceOp::Sum)
                        .map_err(|e| format!("{e:?}"))?;
                }
                nccl::group_end().map_err(|e| format!("{e:?}"))?;
            }
            Ok(())
        })?;
        println!(
            "| {len} | {} | {:.2} | {:.2} | {c:.2} |",
            len * 4 / 1024,
            p[0],
            p[1]
        );
    }
    Ok(())
}

/// Microseconds per all-reduce: `enqueue` captured on every stream, replayed REPLAYS times after warm-up.
fn time_graphs(streams: &[Arc<CudaStream>], enqueue: impl FnOnce() -> R<()>) -> R<f64> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    for s in streams {
        s.begin_capture(mode)?;
    }
    enqueue()?;
    let graphs: Vec<CudaGraph> = streams
        .iter()
        .map(|s| {
            s.end_capture(sys::CUgraphInstantiate_flags(0))?
                .ok_or_else(|| "no graph".into())
        })
        .collect::<R<_>>()?;
    let replay = |times: usize| -> R<()> {
        for _ in 0..times {
            for g in &graphs {
                g.launch()?;
            }
        }
        for s in streams {
            s.synchronize()?;
        }
        Ok(())
    };
    replay(3)?;
    let t = Instant::now();
    replay(REPLAYS)?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / (REPLAYS * CALLS) as f64)
}

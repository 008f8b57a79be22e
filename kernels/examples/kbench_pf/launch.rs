//! `kbench launch [N]`: what one dependent kernel launch costs on this GPU, eagerly and in a replayed CUDA graph.
//! A decode step at batch 1 is ~1000 dependent launches, so this floor, times the launch count, is the part of the
//! step that no kernel speed-up can remove (only fewer launches can). N launches (default 1000) of an empty
//! kernel that bumps one counter (so each launch depends on the last), with 1 block and with 4 blocks per SM;
//! then, for comparison, N grid-wide barriers inside one resident launch (what a persistent decode kernel would
//! pay per dependency instead). The kernels are compiled here by NVRTC so the product's module carries no probe.
use dsv4_kernels::cudarc::driver::{sys, CudaFunction, LaunchConfig, PushKernelArg};
use dsv4_kernels::cudarc::nvrtc::compile_ptx;
use dsv4_kernels::GpuContext;

use super::R;

const PROBE: &str = r#"extern "C" __global__ void probe_bump(int* c) {
    if (threadIdx.x == 0 && blockIdx.x == 0) c[0] += 1;
}
// n grid-wide barriers inside one launch (every block resident: the grid is at most a few blocks per SM): thread 0
// of each block reads the generation, arrives on the counter; the last to arrive resets it and bumps the
// generation, the others spin until it moves.
extern "C" __global__ void probe_barriers(unsigned* bar, int n) {
    for (int i = 0; i < n; ++i) {
        __syncthreads();
        if (threadIdx.x == 0) {
            volatile unsigned* vb = bar;
            const unsigned gen = vb[1];
            __threadfence();
            if (atomicAdd(&bar[0], 1u) == gridDim.x - 1) {
                vb[0] = 0u;
                __threadfence();
                atomicAdd(&bar[1], 1u);
            } else {
                while (vb[1] == gen) {}
            }
            __threadfence();
        }
        __syncthreads();
    }
}"#;

/// Milliseconds of one run of `f` (median of 5 after 2 warm-ups), by events on the context's stream.
fn run_ms(g: &GpuContext, mut f: impl FnMut() -> R<()>) -> R<f64> {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (g.ctx.new_event(flags)?, g.ctx.new_event(flags)?);
    let mut v = Vec::new();
    for i in 0..7 {
        a.record(&g.stream)?;
        f()?;
        b.record(&g.stream)?;
        b.synchronize()?;
        if i >= 2 {
            v.push(f64::from(a.elapsed_ms(&b)?));
        }
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Queues `n` dependent launches of `f` with `blocks` blocks of 128 threads.
fn queue(
    g: &GpuContext,
    f: &CudaFunction,
    c: &mut dsv4_kernels::cudarc::driver::CudaSlice<i32>,
    n: usize,
    blocks: u32,
) -> R<()> {
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    for _ in 0..n {
        let mut l = g.stream.launch_builder(f);
        l.arg(&mut *c);
        // SAFETY: probe_bump(int* c) writes c[0] only; c holds one i32.
        unsafe { l.launch(cfg) }?;
    }
    Ok(())
}

/// Microseconds per grid-wide barrier of `probe_barriers` with `blocks` blocks of 128 threads (n barriers in one
/// launch, the launch's own cost subtracted through a run with none).
fn barrier_us(g: &GpuContext, f: &CudaFunction, n: usize, blocks: u32) -> R<f64> {
    let mut bar = g.stream.alloc_zeros::<u32>(2)?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut once = |count: i32| -> R<f64> {
        run_ms(g, || {
            let mut l = g.stream.launch_builder(f);
            l.arg(&mut bar).arg(&count);
            // SAFETY: probe_barriers(unsigned* bar, int n) uses bar[0..2]; every block is resident (a few per
            // SM at most, 128 threads, no shared memory), so the spin always ends.
            unsafe { l.launch(cfg) }?;
            Ok(())
        })
    };
    let full = once(i32::try_from(n)?)?;
    let none = once(0)?;
    Ok(1000.0 * (full - none) / n as f64)
}

pub fn bench(g: &GpuContext, n: usize) -> R<()> {
    let module = g.ctx.load_module(compile_ptx(PROBE)?)?;
    let f = module.load_function("probe_bump")?;
    let fb = module.load_function("probe_barriers")?;
    let mut c = g.stream.alloc_zeros::<i32>(1)?;
    let sms = g.info.sm_count;
    println!("| launches | blocks | eager us/launch | graph us/launch |\n|---|---|---|---|");
    for blocks in [1, 4 * sms] {
        let eager = run_ms(g, || queue(g, &f, &mut c, n, blocks))?;
        g.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        queue(g, &f, &mut c, n, blocks)?;
        let graph = g
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))?
            .ok_or("empty graph")?;
        let replay = run_ms(g, || Ok(graph.launch()?))?;
        let per = |ms: f64| 1000.0 * ms / n as f64;
        println!(
            "| {n} | {blocks} | {:.2} | {:.2} |",
            per(eager),
            per(replay)
        );
    }
    // What a persistent kernel would pay instead of a launch per dependency: one grid-wide barrier.
    println!("\n| barriers | blocks | us/barrier |\n|---|---|---|");
    for blocks in [sms, 2 * sms, 4 * sms] {
        println!("| {n} | {blocks} | {:.2} |", barrier_us(g, &fb, n, blocks)?);
    }
    Ok(())
}

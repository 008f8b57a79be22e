//! The peer all-reduce of GPUs in one process (cuda/peer.cu): every rank pushes its partial into its
//! peers' receive slots over NVLink, raises a flag there, waits for theirs and sums in rank order, so all
//! ranks end with the same bits. The per-call epoch lives in device memory and the kernels advance it,
//! so the launches are captured into CUDA graphs and replayed any number of times.
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaViewMut, DeviceRepr, LaunchConfig};

use super::{int, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, KernelError, Result};
use crate::launch::Args;

/// Most ranks of one peer all-reduce (PEER_RANKS in peer.cu).
pub const PEER_RANKS: usize = 8;
/// Most blocks of one launch (PEER_BLOCKS: the flags per sender).
const PEER_BLOCKS: usize = 128;
const PEER_THREADS: u32 = 256;
/// Elements per block before the grid grows (up to PEER_BLOCKS): 512 measured 1-9% faster than 2048 alone
/// (16 KB to 4 MB) and 0.2-1.2% faster per split decode step at batch 1-64 (kernels/BENCH_NOTES.md,
/// 2026-11-30 p2par).
const PER_BLOCK: usize = 512;

const NAME: &str = "peer_sum_f32";

/// The C struct `PeerPtrs` of cuda/peer.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct PeerPtrs {
    recv: [u64; PEER_RANKS],
    flags: [u64; PEER_RANKS],
}

// SAFETY: #[repr(C)] arrays of u64 device addresses, laid out as the C struct PeerPtrs; no references.
unsafe impl DeviceRepr for PeerPtrs {}

/// Device memory from `cuMemAlloc` (not the stream-ordered pool cudarc allocates from: pool memory is
/// not mapped for peers by `cuCtxEnablePeerAccess`), zeroed, freed on drop.
struct PeerMem {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl PeerMem {
    fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread()?;
        // SAFETY: the context is current; a plain allocation of `bytes`, owned (and freed) by the result.
        let ptr = unsafe { result::malloc_sync(bytes) }?;
        let mem = PeerMem {
            ctx: ctx.clone(),
            ptr,
        };
        // SAFETY: `ptr` holds `bytes` bytes of this context; the synchronize below completes the memset.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }?;
        ctx.synchronize()?;
        Ok(mem)
    }
}

impl Drop for PeerMem {
    fn drop(&mut self) {
        // Nothing to report to from a drop; a failure here leaves the memory to the context's teardown.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in this context and freed once, here; the owner drops it only
            // after the graphs and launches that use it (see PeerAllReduce).
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Whether every GPU can read and write every other's memory directly (distinct devices only).
pub fn peer_access_possible(gpus: &[Arc<GpuContext>]) -> Result<bool> {
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            if a.ctx.cu_device() == b.ctx.cu_device() {
                return Ok(false);
            }
            let mut can = 0;
            // SAFETY: two valid device handles and a live out-pointer.
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.ctx.cu_device(), b.ctx.cu_device()) }
                .result()?;
            if can == 0 {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Maps every GPU's memory into every other's context (already enabled counts as done).
fn enable_peer_access(gpus: &[Arc<GpuContext>]) -> Result<()> {
    for (i, a) in gpus.iter().enumerate() {
        a.ctx.bind_to_thread()?;
        for (j, b) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            // SAFETY: `a`'s context is current and `b`'s is a live context of another device.
            let r = unsafe { sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
            if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                r.result()?;
            }
        }
    }
    Ok(())
}

/// One rank's side: its GPU and the memory its peers write into.
struct PeerRank {
    gpu: Arc<GpuContext>,
    /// f32 [2 parities][world senders][cap]; only its address is used (in `ptrs`), held to free it last.
    _recv: PeerMem,
    /// u64 [world senders][PEER_BLOCKS] flags, then the epoch and the blocks-done counter (u64 each).
    flags: PeerMem,
}

/// The peer all-reduce over `gpus` (rank r on `gpus[r]`), summing at most `cap` elements per launch;
/// longer calls go in several launches.
pub struct PeerAllReduce {
    ranks: Vec<PeerRank>,
    ptrs: PeerPtrs,
    cap: usize,
    per_block: usize,
}

impl PeerAllReduce {
    /// Enables peer access and allocates every rank's slots for messages of up to `cap` f32 per launch.
    /// `Unavailable` when the GPUs cannot reach each other's memory.
    pub fn new(gpus: &[Arc<GpuContext>], cap: usize) -> Result<Self> {
        let world = gpus.len();
        check(NAME, (2..=PEER_RANKS).contains(&world) && cap > 0, || {
            format!("{world} ranks (2..={PEER_RANKS}), cap {cap}")
        })?;
        if !peer_access_possible(gpus)? {
            return Err(KernelError::Unavailable {
                kernel: NAME,
                why: "the GPUs have no peer access to each other".into(),
            });
        }
        enable_peer_access(gpus)?;
        // A multiple of 4, so every slot and chunk stays 16-byte aligned for the float4 accesses.
        let cap = cap.next_multiple_of(4);
        let flag_words = world * PEER_BLOCKS + 2;
        let mut ptrs = PeerPtrs::default();
        let mut ranks = Vec::with_capacity(world);
        for (r, g) in gpus.iter().enumerate() {
            let recv = PeerMem::zeroed(&g.ctx, 2 * world * cap * 4)?;
            let flags = PeerMem::zeroed(&g.ctx, flag_words * 8)?;
            ptrs.recv[r] = recv.ptr;
            ptrs.flags[r] = flags.ptr;
            ranks.push(PeerRank {
                gpu: g.clone(),
                _recv: recv,
                flags,
            });
        }
        Ok(PeerAllReduce {
            ranks,
            ptrs,
            cap,
            per_block: PER_BLOCK,
        })
    }

    /// Elements per block before the grid grows (default 512), for tuning runs (examples/peerbench.rs).
    pub fn with_block_elems(mut self, elems: usize) -> Self {
        self.per_block = elems.max(1);
        self
    }

    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// Most elements one launch sums.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Sums the first `len` elements of every rank's buffer (`bufs[r]` on rank r's GPU) in rank order,
    /// leaving the sum in each; enqueued on every rank's stream, no host sync (graph-capturable).
    pub fn all_reduce_sum(&self, bufs: &mut [&mut CudaSlice<f32>], len: usize) -> Result<()> {
        let world = self.world();
        check(NAME, bufs.len() == world, || {
            format!("{} buffers for {world} ranks", bufs.len())
        })?;
        check(NAME, bufs.iter().all(|b| b.len() >= len), || {
            format!("a buffer is shorter than {len}")
        })?;
        let own = |(b, r): (&&mut CudaSlice<f32>, &PeerRank)| Arc::ptr_eq(b.context(), &r.gpu.ctx);
        check(NAME, bufs.iter().zip(&self.ranks).all(own), || {
            "a buffer is not on its rank's GPU".into()
        })?;
        let mut start = 0;
        while start < len {
            let n = (len - start).min(self.cap);
            for (r, (rank, b)) in self.ranks.iter().zip(bufs.iter_mut()).enumerate() {
                self.launch(r, rank, &mut b.slice_mut(start..start + n), n)?;
            }
            start += n;
        }
        Ok(())
    }

    fn launch(
        &self,
        r: usize,
        rank: &PeerRank,
        buf: &mut CudaViewMut<'_, f32>,
        n: usize,
    ) -> Result<()> {
        let stream = &rank.gpu.stream;
        let bp = ptr_mut(buf, stream);
        check(NAME, bp % 16 == 0, || {
            format!("buffer at {bp:#x} is not 16-byte aligned")
        })?;
        let blocks = n.div_ceil(self.per_block).clamp(1, PEER_BLOCKS);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (PEER_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (nn, cap) = (n as u64, self.cap as u64);
        let state = rank.flags.ptr + (self.world() * PEER_BLOCKS * 8) as u64;
        let (ri, wi) = (int(NAME, "rank", r)?, int(NAME, "world", self.world())?);
        let mut a = Args::new();
        a.arg(&bp)
            .arg(&nn)
            .arg(&self.ptrs)
            .arg(&state)
            .arg(&ri)
            .arg(&wi)
            .arg(&cap);
        let f = &rank.gpu.kernels.split.peer_sum;
        // SAFETY: peer_sum_f32(buf, n, ptrs, state, rank, world, cap): buf holds n f32 of this GPU (a view
        // of a checked slice), 16-byte aligned; every rank's recv holds 2*world*cap f32 and its flags
        // world*PEER_BLOCKS + 2 u64, all mapped into every rank's context (enable_peer_access); the grid
        // (<= PEER_BLOCKS blocks) depends on n only, so all ranks' launches of this call match; the kernel
        // calls pdl_wait first.
        unsafe { rank.gpu.launch_k(stream, f, cfg, &mut a) }
    }
}

impl Drop for PeerAllReduce {
    fn drop(&mut self) {
        // Launches still in flight read and write every rank's slots: let them finish before the memory
        // goes (errors cannot be reported from a drop, and a stream in error has nothing in flight).
        for r in &self.ranks {
            let _ = r.gpu.stream.synchronize();
        }
    }
}

impl std::fmt::Debug for PeerAllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerAllReduce")
            .field("world", &self.world())
            .field("cap", &self.cap)
            .finish()
    }
}

//! Collectives between GPU ranks, step-synchronous like [`crate::parallel::Collective`]: one call
//! carries every rank's buffer and enqueues the work on every rank's stream without a host sync, so it
//! is captured into the decode graphs. Three implementations behind the same rank code:
//! [`OnDeviceSum`] for ranks simulated on one GPU (a small summing kernel, a device copy for the
//! hand-off), [`PeerSum`] for one rank per GPU with peer access (a kernel per rank that reads its
//! peers' partials over NVLink; all-reduce only, the tensor split's one collective) and [`NcclComms`]
//! for one rank per GPU otherwise (NCCL, one communicator per GPU created in this process; one host
//! thread drives all of them inside `ncclGroupStart/End`).

use crate::gpu::RunnerError;
use crate::parallel::plan::SplitMode;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::cudarc::nccl::{self, ReduceOp};
use dsv4_kernels::{bf16, peer_access_possible, GpuContext, PeerAllReduce};
use std::sync::Arc;

/// The communication a split GPU model needs.
pub trait GpuCollective: Send {
    /// "on-device sum" or "NCCL", for logs and reports.
    fn name(&self) -> &'static str;
    fn world(&self) -> usize;
    /// Sums the first `len` elements of every rank's buffer (rank r's on rank r's GPU), leaving the
    /// sum in each.
    fn all_reduce_sum(
        &self,
        bufs: &mut [&mut CudaSlice<f32>],
        len: usize,
    ) -> Result<(), RunnerError>;
    /// Copies the first `len` elements of `src` (on rank `from`) into `dst` (on rank `to`).
    fn send(
        &self,
        from: usize,
        to: usize,
        src: &CudaSlice<bf16>,
        dst: &mut CudaSlice<bf16>,
        len: usize,
    ) -> Result<(), RunnerError>;
}

fn fail(m: impl Into<String>) -> RunnerError {
    RunnerError::Collective(m.into())
}

fn check_world(world: usize, got: usize) -> Result<(), RunnerError> {
    if world == got {
        Ok(())
    } else {
        Err(fail(format!("{got} buffers for {world} ranks")))
    }
}

/// Which collective joins ranks on distinct GPUs (ranks simulated on one GPU always use the on-device
/// sum, and the layer split's hand-offs always NCCL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CollectiveKind {
    /// `DSV4_COLLECTIVE` (`nccl` or `peer`) when set; otherwise the peer sum where the GPUs have peer
    /// access, NCCL elsewhere.
    #[default]
    Auto,
    Nccl,
    /// Fails without peer access.
    Peer,
}

impl CollectiveKind {
    /// `Auto` resolved against `DSV4_COLLECTIVE` (still `Auto` when it is unset or empty).
    fn resolved(self) -> Result<Self, RunnerError> {
        if self != CollectiveKind::Auto {
            return Ok(self);
        }
        match std::env::var("DSV4_COLLECTIVE")
            .unwrap_or_default()
            .as_str()
        {
            "" => Ok(CollectiveKind::Auto),
            "nccl" => Ok(CollectiveKind::Nccl),
            "peer" => Ok(CollectiveKind::Peer),
            other => Err(fail(format!(
                "DSV4_COLLECTIVE={other}: expected `nccl` or `peer`"
            ))),
        }
    }
}

/// The collective for ranks on `gpus` (`gpus[r]` rank r's): the on-device sum when all share one GPU;
/// with one GPU each, for the tensor split the peer sum or NCCL as `kind` says (see [`CollectiveKind`]),
/// for the layer split NCCL (its hand-offs).
pub fn collective_for(
    gpus: &[Arc<GpuContext>],
    mode: SplitMode,
    kind: CollectiveKind,
) -> Result<Box<dyn GpuCollective>, RunnerError> {
    let Some(first) = gpus.first() else {
        return Err(RunnerError::Split("no GPUs given".into()));
    };
    if gpus.iter().all(|g| Arc::ptr_eq(g, first)) {
        return Ok(Box::new(OnDeviceSum::new(first.clone(), gpus.len())));
    }
    let distinct = gpus
        .iter()
        .enumerate()
        .all(|(i, g)| gpus[..i].iter().all(|o| !Arc::ptr_eq(o, g)));
    if !distinct {
        return Err(RunnerError::Split(
            "ranks must all share one GPU (simulated) or each have their own".into(),
        ));
    }
    let peer = match (mode, kind.resolved()?) {
        (SplitMode::Layer, _) | (_, CollectiveKind::Nccl) => false,
        (_, CollectiveKind::Peer) => true,
        (_, CollectiveKind::Auto) => {
            gpus.len() <= dsv4_kernels::PEER_RANKS && peer_access_possible(gpus)?
        }
    };
    if peer {
        Ok(Box::new(PeerSum::new(gpus)?))
    } else {
        let streams = gpus.iter().map(|g| g.stream.clone()).collect();
        Ok(Box::new(NcclComms::new(streams)?))
    }
}

/// Ranks simulated on one GPU: every buffer lives on that GPU and is summed there in rank order.
pub struct OnDeviceSum {
    gpu: Arc<GpuContext>,
    world: usize,
}

impl OnDeviceSum {
    pub fn new(gpu: Arc<GpuContext>, world: usize) -> Self {
        OnDeviceSum { gpu, world }
    }
}

impl GpuCollective for OnDeviceSum {
    fn name(&self) -> &'static str {
        "on-device sum"
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(
        &self,
        bufs: &mut [&mut CudaSlice<f32>],
        len: usize,
    ) -> Result<(), RunnerError> {
        check_world(self.world, bufs.len())?;
        if self.world > 1 {
            self.gpu.launch_rank_sum_f32(&self.gpu.stream, bufs, len)?;
        }
        Ok(())
    }

    fn send(
        &self,
        from: usize,
        to: usize,
        src: &CudaSlice<bf16>,
        dst: &mut CudaSlice<bf16>,
        len: usize,
    ) -> Result<(), RunnerError> {
        if from >= self.world || to >= self.world || src.len() < len || dst.len() < len {
            return Err(fail(format!("send of {len} from rank {from} to {to}")));
        }
        let s = &self.gpu.stream;
        s.memcpy_dtod(&src.slice(..len), &mut dst.slice_mut(..len))?;
        Ok(())
    }
}

/// A communicator that may move to the engine thread.
struct SendComm(nccl::Comm);

// SAFETY: an NCCL communicator is not tied to the creating thread; the owner (one model) uses its
// communicators from one thread at a time, which is what NCCL requires.
unsafe impl Send for SendComm {}

/// One rank per GPU through NCCL.
pub struct NcclComms {
    comms: Vec<SendComm>,
}

impl NcclComms {
    /// One communicator per stream (each on its own GPU), created together in this process.
    pub fn new(streams: Vec<Arc<CudaStream>>) -> Result<Self, RunnerError> {
        // SAFETY: probing for the library only loads it; it runs no NCCL code.
        if !unsafe { nccl::sys::is_culib_present() } {
            return Err(fail(
                "libnccl not found (install NCCL 2.x for several GPUs)",
            ));
        }
        let comms =
            nccl::Comm::from_devices(streams).map_err(|e| fail(format!("NCCL init: {e:?}")))?;
        Ok(NcclComms {
            comms: comms.into_iter().map(SendComm).collect(),
        })
    }

    /// Runs `f` inside one NCCL group, so one thread can issue every rank's call.
    fn group(&self, f: impl FnOnce() -> Result<(), RunnerError>) -> Result<(), RunnerError> {
        nccl::group_start().map_err(|e| fail(format!("ncclGroupStart: {e:?}")))?;
        let r = f();
        // End the group even after an error, or NCCL stays inside it.
        let ended = nccl::group_end().map_err(|e| fail(format!("ncclGroupEnd: {e:?}")));
        r.and(ended.map(|_| ()))
    }
}

impl GpuCollective for NcclComms {
    fn name(&self) -> &'static str {
        "NCCL"
    }

    fn world(&self) -> usize {
        self.comms.len()
    }

    fn all_reduce_sum(
        &self,
        bufs: &mut [&mut CudaSlice<f32>],
        len: usize,
    ) -> Result<(), RunnerError> {
        check_world(self.comms.len(), bufs.len())?;
        self.group(|| {
            for (c, b) in self.comms.iter().zip(bufs.iter_mut()) {
                c.0.all_reduce_in_place(&mut b.slice_mut(..len), &ReduceOp::Sum)
                    .map_err(|e| fail(format!("ncclAllReduce on rank {}: {e:?}", c.0.rank())))?;
            }
            Ok(())
        })
    }

    fn send(
        &self,
        from: usize,
        to: usize,
        src: &CudaSlice<bf16>,
        dst: &mut CudaSlice<bf16>,
        len: usize,
    ) -> Result<(), RunnerError> {
        let (Some(a), Some(b)) = (self.comms.get(from), self.comms.get(to)) else {
            return Err(fail(format!("send from rank {from} to {to}")));
        };
        self.group(|| {
            a.0.send(&src.slice(..len), to as i32)
                .map_err(|e| fail(format!("ncclSend: {e:?}")))?;
            b.0.recv(&mut dst.slice_mut(..len), from as i32)
                .map_err(|e| fail(format!("ncclRecv: {e:?}")))?;
            Ok(())
        })
    }
}

/// Elements one peer launch sums (4 MiB of f32 per slot): a decode step's largest message (64 rows of
/// 4096) in one launch. Longer messages (prefill chunks) go through NCCL where it is present.
const PEER_CAP: usize = 1 << 20;

/// One rank per GPU, the GPUs with peer access: the all-reduce is one kernel per rank that pushes its
/// partial to every peer over NVLink, waits on flags in device memory and sums in rank order, so every
/// rank gets the same bits (see kernels/cuda/peer.cu). Much cheaper than NCCL for the decode's small
/// messages inside CUDA graphs; messages longer than one launch go through NCCL when libnccl is present
/// (a prefill chunk's 16-128 MB: NCCL's one call outran the peer kernel's launches of 4 MB, kernels/
/// BENCH_NOTES.md 2026-11-30 p2par), otherwise through several peer launches. Has no hand-off: the layer
/// split keeps NCCL.
pub struct PeerSum {
    inner: PeerAllReduce,
    /// NCCL for the long messages (None without libnccl).
    long: Option<NcclComms>,
}

impl PeerSum {
    /// Enables peer access between `gpus` (one rank each) and allocates the receive slots; an error
    /// when the GPUs cannot reach each other. `DSV4_PEER_BLOCK_ELEMS` (diagnostic) overrides the
    /// elements per block of the kernel's grid.
    pub fn new(gpus: &[Arc<GpuContext>]) -> Result<Self, RunnerError> {
        let mut inner = PeerAllReduce::new(gpus, PEER_CAP)?;
        let tuned = std::env::var("DSV4_PEER_BLOCK_ELEMS").ok();
        if let Some(elems) = tuned.and_then(|v| v.parse().ok()) {
            inner = inner.with_block_elems(elems);
        }
        // Optional: without NCCL the long messages take several peer launches, still correct.
        let long = NcclComms::new(gpus.iter().map(|g| g.stream.clone()).collect()).ok();
        Ok(PeerSum { inner, long })
    }
}

impl GpuCollective for PeerSum {
    fn name(&self) -> &'static str {
        "peer sum"
    }

    fn world(&self) -> usize {
        self.inner.world()
    }

    fn all_reduce_sum(
        &self,
        bufs: &mut [&mut CudaSlice<f32>],
        len: usize,
    ) -> Result<(), RunnerError> {
        check_world(self.inner.world(), bufs.len())?;
        match &self.long {
            Some(nccl) if len > self.inner.cap() => nccl.all_reduce_sum(bufs, len),
            _ => Ok(self.inner.all_reduce_sum(bufs, len)?),
        }
    }

    fn send(
        &self,
        from: usize,
        to: usize,
        _: &CudaSlice<bf16>,
        _: &mut CudaSlice<bf16>,
        _: usize,
    ) -> Result<(), RunnerError> {
        Err(fail(format!(
            "send from rank {from} to {to}: the peer sum has no hand-off (the layer split uses NCCL)"
        )))
    }
}

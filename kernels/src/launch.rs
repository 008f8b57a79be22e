//! Kernel launches through `cuLaunchKernelEx`, with programmatic dependent launch (PDL) on sm_90+.
//!
//! With PDL a kernel may be scheduled while the previous kernel on the stream is still running: its blocks
//! become resident and wait in `griddepcontrol.wait` (common.cuh `pdl_wait`) until the previous grid has
//! completed and its writes are visible. The previous grid lets it be scheduled when its blocks exit, or
//! earlier where they call `pdl_trigger` (the decode GEMVs and routed experts, after their main loop). Every
//! kernel launched here calls `pdl_wait()` before it touches memory another kernel writes (GEMVs prefetch their
//! constant weights first), so results are the same bits with PDL on or off (every GPU test passes either way).
//! Measured (H200, full-size `dsv4 bench`, 4K context, graph replay, ms per step at batch 1 / 8, same call,
//! twelfth session): 7.15 / 15.37 without PDL, **6.81 / 14.61** with it; another call, batch 1 / 8 / 64:
//! 7.11 / 15.13 / 45.4-45.6 without, 6.77 / 14.34 / 44.8-45.1 with. The earlier placement (every kernel
//! triggering right after its wait, tenth session) was slower than none, 7.23 / 15.49, so PDL was off then.
//! PDL is on by default on sm_90+; `DSV4_PDL=0` turns it off.
use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig};

use crate::error::{KernelError, Result};

/// Most arguments of one kernel.
const MAX_ARGS: usize = 24;

/// Kernel arguments by reference (no allocation): pointers to the caller's values, which must outlive
/// the launch call (the driver copies them during `cuLaunchKernelEx`).
pub(crate) struct Args<'a> {
    ptrs: [*mut c_void; MAX_ARGS],
    n: usize,
    overflow: bool,
    _vals: PhantomData<&'a ()>,
}

impl<'a> Args<'a> {
    pub(crate) fn new() -> Self {
        Args {
            ptrs: [std::ptr::null_mut(); MAX_ARGS],
            n: 0,
            overflow: false,
            _vals: PhantomData,
        }
    }

    /// Appends one by-value kernel argument (a device address, a scalar or a `#[repr(C)]` struct).
    pub(crate) fn arg<T: DeviceRepr>(&mut self, v: &'a T) -> &mut Self {
        match self.ptrs.get_mut(self.n) {
            Some(slot) => {
                *slot = v as *const T as *mut c_void;
                self.n += 1;
            }
            None => self.overflow = true,
        }
        self
    }
}

/// Whether PDL is used on a device of compute capability `major`: sm_90+ unless `DSV4_PDL=0`.
pub(crate) fn pdl_wanted(major: i32) -> bool {
    major >= 9 && std::env::var("DSV4_PDL").map_or(true, |v| v != "0")
}

/// Launches `f` on `stream` (PDL when `pdl`).
///
/// # Safety
/// `args` must match the kernel's parameter list and every address in them must be valid for the grid;
/// the kernel must call `pdl_wait()` before reading or writing memory that earlier kernels use.
pub(crate) unsafe fn launch(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut Args<'_>,
    pdl: bool,
) -> Result<()> {
    if args.overflow {
        return Err(KernelError::Shape {
            kernel: "launch",
            what: format!("more than {MAX_ARGS} kernel arguments"),
        });
    }
    stream.context().bind_to_thread()?;
    // SAFETY: CUlaunchAttribute is plain data (an id and a union of integers); all-zero is valid.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let conf = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: u32::from(pdl),
    };
    // SAFETY: conf points at `attr` (alive for the call); args holds `n` pointers to live values matching
    // the kernel's parameters (the caller's contract); no `extra` block.
    unsafe {
        sys::cuLaunchKernelEx(
            &conf,
            f.cu_function(),
            args.ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()?;
    }
    Ok(())
}

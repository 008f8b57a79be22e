//! Loads the kernel module: the embedded fatbin when the build had nvcc, otherwise NVRTC-compiled PTX for the
//! GPU present, cached on disk by source hash and architecture.
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::error::{KernelError, Result};

/// The concatenated kernel source (always embedded: the NVRTC fallback compiles it).
pub const KERNEL_SOURCE: &str = include_str!(concat!(env!("OUT_DIR"), "/dsv4_kernels_all.cu"));

/// The fatbin built by nvcc (SASS sm_90a + sm_120a, PTX compute_90), if the build found nvcc.
#[cfg(dsv4_fatbin)]
pub const EMBEDDED_FATBIN: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("OUT_DIR"),
    "/dsv4_kernels.fatbin"
)));
#[cfg(not(dsv4_fatbin))]
pub const EMBEDDED_FATBIN: Option<&[u8]> = None;

/// Where the loaded module came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleSource {
    Fatbin,
    /// NVRTC PTX; `cached` when read back from the disk cache at `path`.
    Nvrtc {
        path: Option<PathBuf>,
        cached: bool,
    },
}

/// Loads the module for a device of compute capability `cc`. `force_nvrtc` (or env `DSV4_FORCE_NVRTC=1`)
/// skips the fatbin, to exercise the fallback on a build that had nvcc.
pub(crate) fn load(
    ctx: &Arc<CudaContext>,
    cc: (i32, i32),
    force_nvrtc: bool,
) -> Result<(Arc<CudaModule>, ModuleSource)> {
    let force_nvrtc = force_nvrtc || std::env::var("DSV4_FORCE_NVRTC").is_ok_and(|v| v == "1");
    if let (Some(bytes), false) = (EMBEDDED_FATBIN, force_nvrtc) {
        let module = ctx.load_module(Ptx::from_binary(bytes.to_vec()))?;
        return Ok((module, ModuleSource::Fatbin));
    }
    let path = cache_path(cc);
    if let Some(p) = &path {
        if let Ok(ptx) = std::fs::read_to_string(p) {
            let module = ctx.load_module(Ptx::from_src(ptx))?;
            return Ok((module, ModuleSource::Nvrtc { path, cached: true }));
        }
    }
    let ptx = compile_ptx(cc)?;
    if let Some(p) = &path {
        write_cache(p, &ptx.to_src())?;
    }
    let module = ctx.load_module(ptx)?;
    Ok((
        module,
        ModuleSource::Nvrtc {
            path,
            cached: false,
        },
    ))
}

/// Compiles [`KERNEL_SOURCE`] to PTX for `compute_<major><minor>` (no arch-specific features are used).
pub fn compile_ptx(cc: (i32, i32)) -> Result<Ptx> {
    let opts = CompileOptions {
        options: vec![
            format!("--gpu-architecture=compute_{}{}", cc.0, cc.1),
            "-std=c++17".into(),
        ],
        include_paths: vec!["/usr/local/cuda/include".into()],
        ..Default::default()
    };
    Ok(cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts)?)
}

/// `$XDG_CACHE_HOME/dsv4-chat/kernels/<fnv64(source)>-sm<cc>.ptx` (or `~/.cache/...`); None with no home.
fn cache_path(cc: (i32, i32)) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let name = format!(
        "{:016x}-sm{}{}.ptx",
        fnv64(KERNEL_SOURCE.as_bytes()),
        cc.0,
        cc.1
    );
    Some(base.join("dsv4-chat").join("kernels").join(name))
}

fn write_cache(path: &PathBuf, ptx: &str) -> Result<()> {
    let err = |source| KernelError::Cache {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // Write then rename, so a concurrent reader never sees half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, ptx).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

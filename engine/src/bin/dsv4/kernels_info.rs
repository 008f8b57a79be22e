//! `dsv4 kernels`: says which precompiled CUDA kernels this binary carries, so a package can be checked
//! without a GPU. Release packages must embed SASS for every supported GPU; a build without nvcc embeds none
//! and compiles the kernels at run time with NVRTC instead.

use dsv4_kernels::fatbin::{self, EntryKind, FatbinEntry};
use dsv4_kernels::EMBEDDED_FATBIN;

/// nvcc sets this flag bit on arch-specific ("a") targets such as sm_90a.
const ARCH_SPECIFIC: u64 = 0x10_0000;

#[derive(clap::Args)]
pub struct KernelsArgs {
    /// Fail unless the fatbin holds each of these targets (comma-separated, e.g. `sm_90a,sm_120a,compute_90`).
    #[arg(long, value_delimiter = ',')]
    require: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum KernelsInfoError {
    #[error("no fatbin embedded (built without nvcc), but --require asked for {0}")]
    NoFatbin(String),
    #[error("the embedded fatbin is malformed")]
    Malformed,
    #[error("the embedded fatbin lacks {0}")]
    Missing(String),
}

/// The name nvcc's `-gencode code=` uses for an entry: `sm_90a`, `sm_120a`, `compute_90`, ...
fn target_name(e: &FatbinEntry) -> String {
    let suffix = if e.flags & ARCH_SPECIFIC != 0 {
        "a"
    } else {
        ""
    };
    match e.kind {
        EntryKind::Sass => format!("sm_{}{suffix}", e.arch),
        EntryKind::Ptx => format!("compute_{}{suffix}", e.arch),
        EntryKind::Other(k) => format!("kind{k}_{}{suffix}", e.arch),
    }
}

pub fn run(args: &KernelsArgs) -> Result<(), KernelsInfoError> {
    let required: Vec<&str> = args
        .require
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    let Some(bytes) = EMBEDDED_FATBIN else {
        println!("fatbin: none (kernels are compiled at run time with NVRTC)");
        return if required.is_empty() {
            Ok(())
        } else {
            Err(KernelsInfoError::NoFatbin(required.join(",")))
        };
    };
    let entries = fatbin::entries(bytes).ok_or(KernelsInfoError::Malformed)?;
    let names: Vec<String> = entries.iter().map(target_name).collect();
    let list = |kind: fn(&EntryKind) -> bool| -> String {
        let picked: Vec<&str> = entries
            .iter()
            .zip(&names)
            .filter(|(e, _)| kind(&e.kind))
            .map(|(_, n)| n.as_str())
            .collect();
        if picked.is_empty() {
            "none".to_string()
        } else {
            picked.join(", ")
        }
    };
    println!("fatbin: embedded, {} bytes", bytes.len());
    println!("sass: {}", list(|k| matches!(k, EntryKind::Sass)));
    println!("ptx: {}", list(|k| matches!(k, EntryKind::Ptx)));
    let missing: Vec<&str> = required
        .into_iter()
        .filter(|r| !names.iter().any(|n| n == r))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(KernelsInfoError::Missing(missing.join(", ")))
    }
}

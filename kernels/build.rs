//! Builds the CUDA kernels. With nvcc (env DSV4_NVCC, PATH, /usr/local/cuda, or <workspace>/.venv-nvcc) every
//! `cuda/*.cu` is compiled into ONE fatbin (SASS sm_90a + sm_120a, PTX compute_90) and embedded; without it the
//! concatenated source is embedded and the runtime compiles it with NVRTC (cfg `dsv4_nvrtc`).
//! `DSV4_REQUIRE_FATBIN=1` turns a missing nvcc into a build error (release packaging).
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const GENCODE: [&str; 6] = [
    "-gencode",
    "arch=compute_90a,code=sm_90a",
    "-gencode",
    "arch=compute_120a,code=sm_120a",
    "-gencode",
    "arch=compute_90,code=compute_90",
];

fn main() {
    if let Err(e) = run() {
        panic!("dsv4-kernels build: {e}");
    }
}

fn run() -> Result<(), String> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let cuda_dir = manifest.join("cuda");
    println!("cargo:rerun-if-changed={}", cuda_dir.display());
    println!("cargo:rerun-if-env-changed=DSV4_NVCC");
    println!("cargo:rerun-if-env-changed=DSV4_REQUIRE_FATBIN");
    println!("cargo:rerun-if-env-changed=DSV4_NO_NVCC");
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo::rustc-check-cfg=cfg(dsv4_fatbin)");
    println!("cargo::rustc-check-cfg=cfg(dsv4_nvrtc)");

    let source = combined_source(&cuda_dir)?;
    let src_path = out_dir.join("dsv4_kernels_all.cu");
    fs::write(&src_path, &source).map_err(|e| e.to_string())?;
    let fatbin_path = out_dir.join("dsv4_kernels.fatbin");

    let require = env::var("DSV4_REQUIRE_FATBIN").is_ok_and(|v| v == "1");
    match find_nvcc(&manifest) {
        Some(nvcc) => {
            compile_fatbin(&nvcc, &src_path, &fatbin_path)?;
            println!("cargo:rustc-cfg=dsv4_fatbin");
            println!(
                "cargo:warning=dsv4-kernels: embedded fatbin (sm_90a, sm_120a, compute_90) built with {}",
                nvcc.display()
            );
        }
        None if require => return Err(
            "DSV4_REQUIRE_FATBIN=1 but no nvcc found (set DSV4_NVCC or run .ci/install-nvcc.sh)"
                .into(),
        ),
        None => {
            println!("cargo:rustc-cfg=dsv4_nvrtc");
            println!("cargo:warning=dsv4-kernels: nvcc not found; kernels will be compiled at run time with NVRTC");
        }
    }
    Ok(())
}

/// common.cuh followed by every .cu (sorted) with its `#include "common.cuh"` removed: one translation unit
/// that nvcc and NVRTC both accept without include paths.
fn combined_source(cuda_dir: &Path) -> Result<String, String> {
    let common = fs::read_to_string(cuda_dir.join("common.cuh")).map_err(|e| e.to_string())?;
    let mut files: Vec<PathBuf> = fs::read_dir(cuda_dir)
        .map_err(|e| e.to_string())?
        .filter_map(|d| d.ok().map(|d| d.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    let mut out = common;
    for f in files {
        println!("cargo:rerun-if-changed={}", f.display());
        let text = fs::read_to_string(&f).map_err(|e| e.to_string())?;
        out.push_str(&format!("\n// ===== {} =====\n", f.display()));
        for line in text
            .lines()
            .filter(|l| l.trim() != "#include \"common.cuh\"")
        {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

fn find_nvcc(manifest: &Path) -> Option<PathBuf> {
    // DSV4_NO_NVCC=1 forces the NVRTC build (to test the fallback on a machine that has nvcc).
    if env::var("DSV4_NO_NVCC").is_ok_and(|v| v == "1") {
        return None;
    }
    if let Some(p) = env::var_os("DSV4_NVCC").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(paths) = env::var_os("PATH") {
        if let Some(p) = env::split_paths(&paths)
            .map(|d| d.join("nvcc"))
            .find(|p| p.is_file())
        {
            return Some(p);
        }
    }
    let system = PathBuf::from("/usr/local/cuda/bin/nvcc");
    if system.is_file() {
        return Some(system);
    }
    let lib = manifest.parent()?.join(".venv-nvcc").join("lib");
    fs::read_dir(lib)
        .ok()?
        .filter_map(|d| d.ok().map(|d| d.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
        })
        .map(|p| p.join("site-packages/nvidia/cu13/bin/nvcc"))
        .find(|p| p.is_file())
}

fn compile_fatbin(nvcc: &Path, src: &Path, out: &Path) -> Result<(), String> {
    // No --use_fast_math: rmsnorm and act_quant must match the CPU reference (IEEE div/sqrt, no FTZ).
    let output = Command::new(nvcc)
        .arg("-fatbin")
        .args(GENCODE)
        .args(["-O3", "-std=c++17", "-o"])
        .arg(out)
        .arg(src)
        .output()
        .map_err(|e| format!("running {}: {e}", nvcc.display()))?;
    if !output.status.success() {
        return Err(format!(
            "nvcc failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}

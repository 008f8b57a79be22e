//! Records the commit the engine (and the `dsv4` CLI) is built from, as `DSV4_GIT_COMMIT`: the short hash,
//! `-dirty` when tracked files differ from it, `unknown` when there is no git (e.g. built from a tarball).
//!
//! `DSV4_GIT_COMMIT` set in the environment wins: packaging/build.sh computes it once for the whole build, so
//! the string cannot go stale between what the script checked and what cargo cached.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DSV4_GIT_COMMIT");
    let commit = match std::env::var("DSV4_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => from_git().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=DSV4_GIT_COMMIT={commit}");
}

fn from_git() -> Option<String> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let root = manifest.parent()?.to_path_buf();
    // A source tarball unpacked inside some other repository must not report that repository's commit.
    let top = PathBuf::from(git(&root, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != root.canonicalize().ok()? {
        return None;
    }
    let hash = git(&root, &["rev-parse", "--short", "HEAD"])?;
    // Rerun when HEAD, its branch or the index move. Edits that are never staged do not rerun this script
    // (cargo cannot watch the whole tree cheaply); the packaging script passes DSV4_GIT_COMMIT instead.
    for path in ["HEAD", "index", "packed-refs"] {
        watch(&root, path);
    }
    if let Some(head_ref) = git(&root, &["symbolic-ref", "-q", "HEAD"]) {
        watch(&root, &head_ref);
    }
    let dirty = !Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["diff", "--quiet", "HEAD", "--"])
        .status()
        .ok()?
        .success();
    Some(if dirty { format!("{hash}-dirty") } else { hash })
}

/// Asks cargo to rerun when the git-internal file `name` (e.g. `HEAD`, `refs/heads/main`) changes.
fn watch(root: &Path, name: &str) {
    if let Some(path) = git(root, &["rev-parse", "--git-path", name]) {
        let path = if Path::new(&path).is_absolute() {
            PathBuf::from(path)
        } else {
            root.join(path)
        };
        // A missing file (no packed-refs yet) would make cargo rerun this script, and rebuild the engine,
        // on every build.
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

//! Build script: the git commit the binary is built from, for `ratelimiter --version` and
//! `/healthz`, as the compile-time variable `RATELIMITER_COMMIT`.
//!
//! The commit is, in order: the `RATELIMITER_COMMIT` environment variable when it is set and not
//! empty (the Dockerfile passes it as a build argument, since `.git` is not copied into the
//! image); else the commit `.git/HEAD` names, read by hand, so that no `git` binary is needed
//! (a worktree's `.git` file, a symbolic or detached HEAD, loose or packed refs); else `unknown`.
//!
//! Cargo reruns this script only when `HEAD`, the branch it points to, `packed-refs`, HEAD's
//! reflog or the variable change, so an ordinary `cargo build` does not rebuild the crate for it.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RATELIMITER_COMMIT");
    let given = env::var("RATELIMITER_COMMIT")
        .ok()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    let commit = match given {
        Some(c) => c,
        None => {
            let dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
            from_git(&dir).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=RATELIMITER_COMMIT={commit}");
}

/// Tells cargo to rerun when `path` changes; only for paths that exist, since cargo reruns a
/// script on every build while a watched path is missing.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// The commit `HEAD` names in the repository at `dir`, or `None` when there is no readable one.
fn from_git(dir: &Path) -> Option<String> {
    let dot_git = dir.join(".git");
    // A worktree (or a submodule) has a `.git` file that names its git directory.
    let git_dir = if dot_git.is_file() {
        watch(&dot_git);
        let text = fs::read_to_string(&dot_git).ok()?;
        let named = PathBuf::from(text.strip_prefix("gitdir:")?.trim());
        if named.is_absolute() {
            named
        } else {
            dir.join(named)
        }
    } else if dot_git.is_dir() {
        dot_git.clone()
    } else {
        return None;
    };
    // Never the git directory itself: cargo would scan every object in it on each build.
    // Branch refs live in the common directory, which a worktree names in `commondir`.
    let common = match fs::read_to_string(git_dir.join("commondir")) {
        Ok(c) => {
            let c = PathBuf::from(c.trim());
            if c.is_absolute() {
                c
            } else {
                git_dir.join(c)
            }
        }
        Err(_) => git_dir.clone(),
    };
    let head_path = git_dir.join("HEAD");
    watch(&head_path);
    let head = fs::read_to_string(&head_path).ok()?;
    let head = head.trim();
    let Some(reference) = head.strip_prefix("ref:").map(str::trim) else {
        // A detached HEAD holds the commit itself.
        return is_commit(head).then(|| head.to_owned());
    };
    let loose = common.join(reference);
    let packed = common.join("packed-refs");
    watch(&loose);
    watch(&packed);
    // cargo cannot watch a file that does not exist yet (a branch that is only in
    // `packed-refs`): the reflog of HEAD grows with every commit, checkout and reset here.
    watch(&git_dir.join("logs").join("HEAD"));
    if let Ok(c) = fs::read_to_string(&loose) {
        let c = c.trim();
        return is_commit(c).then(|| c.to_owned());
    }
    let packed = fs::read_to_string(&packed).ok()?;
    packed.lines().find_map(|line| {
        let (commit, name) = line.split_once(' ')?;
        (name.trim() == reference && is_commit(commit)).then(|| commit.to_owned())
    })
}

/// A full SHA-1 or SHA-256 object name in lower-case hex.
fn is_commit(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

//! The shared region of a host's ranks (a file in `HCCL_SHM_DIR`, default `/dev/shm`): its
//! directory's identity, its creation by the host's lowest rank and its mapping by every
//! rank; and whether a rank's process lives.

use super::rendezvous::io_err;
use crate::arena::{Arena, Layout, MAGIC};
use crate::error::{ExecError, Result};
use std::sync::atomic::Ordering;

/// The identity of the directory `dir` as the kernel sees it, whatever path leads to it:
/// its file system's device number and its inode. Two ranks on one machine can open each
/// other's files there exactly when these match (a container's private `/dev/shm` is a
/// tmpfs of its own, with its own device number; `--ipc=host` or a shared IPC namespace
/// gives the same mount, hence the same numbers). Unreadable: the error, matching no
/// readable directory's identity; making or mapping the region then reports the problem.
pub(super) fn shm_identity(dir: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(dir) {
        Ok(m) => format!("{}:{}", m.dev(), m.ino()),
        Err(e) => format!("unreadable {} ({e})", dir.display()),
    }
}

/// Creates the region file exclusively and sizes it.
pub(super) fn create_region(name: &str, total: usize) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(name)?;
    if let Err(e) = file.set_len(total as u64) {
        let _ = std::fs::remove_file(name);
        return Err(e);
    }
    Ok(())
}

/// Maps the region file rank 0 created and sized.
pub(super) fn map_region(rank: u32, name: &str, layout: Layout) -> Result<Arena> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name)
        .map_err(io_err(rank, format!("opening {name}")))?;
    let len = file
        .metadata()
        .map_err(io_err(rank, format!("inspecting {name}")))?
        .len();
    if len < layout.total as u64 {
        return Err(ExecError::Bootstrap {
            rank,
            message: format!(
                "{name} holds {len} bytes but the plan's layout needs {}",
                layout.total
            ),
        });
    }
    // SAFETY: the file is private to this job (unguessable name, created exclusively) and
    // only accessed through the arena protocol. Populated up front: a region whose pages are
    // faulted in lazily by the ranks made cross-process traffic up to 5× slower for the
    // whole job in about half of the launches on the development VM (see `arena::prefault`).
    let mut map = unsafe { memmap2::MmapOptions::new().populate().map_mut(&file) }
        .map_err(io_err(rank, format!("mapping {name}")))?;
    if map.len() < layout.total {
        return Err(ExecError::Bootstrap {
            rank,
            message: format!("{name} is smaller than the layout needs"),
        });
    }
    let base = map.as_mut_ptr();
    // SAFETY: `map` is page-aligned, at least `layout.total` bytes, zero-filled by the kernel
    // on creation, and moves into the owner box (the mapping itself does not move).
    let arena = unsafe { Arena::from_raw(base, layout, Box::new(map)) };
    if let Err(other) =
        arena
            .magic()
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
        && other != MAGIC
    {
        return Err(ExecError::Bootstrap {
            rank,
            message: format!(
                "{name} was laid out by another hccl build (magic {other:#018x}, this build \
                 {MAGIC:#018x}): every rank of a job must run the same hccl build"
            ),
        });
    }
    Ok(arena)
}

/// Whether process `pid` is alive (not gone and not a zombie).
pub(crate) fn pid_alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | Some('x'))
        }
        Err(_) => false,
    }
}

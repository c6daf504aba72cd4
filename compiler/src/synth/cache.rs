//! The on-disk cache of synthesis results: what a solver found for one input, kept between
//! compiles so that the default compile can include synthesizers too dear to run every time
//! (the MILP frontier of [`super::milp`]).
//!
//! **Content-addressed.** An entry's name is the blake3 hash of everything its result depends
//! on: the cache's format tag ([`FORMAT`]), the compiler's version, the LP solver
//! ([`crate::lp::NAME`]), the kind of result and the solver's whole input (for a frontier: the link matrix it reads from the topology, the
//! collective and the search limits). An entry never goes stale; a different input has
//! another name.
//!
//! **Where.** `$HCCL_CACHE_DIR`, else `$XDG_CACHE_HOME/hccl`, else `~/.cache/hccl`
//! ([`default_dir`]); entries under `synth/`. `hcclc compile --no-cache` (and
//! [`Options::cache_dir`](crate::search::Options::cache_dir) `None`, the library's default)
//! neither reads nor writes it.
//!
//! **Safe under concurrent compiles.** An entry is written to a temporary file beside it and
//! renamed over its name ([`store_entry`]): a reader sees a whole entry or none.
//! Two compiles that solve the same input write the same bytes. An entry that cannot be read,
//! is truncated, fails its checksum or does not parse is ignored (and recomputed, then
//! written again); a cache directory that cannot be written only costs the next compile the
//! solve. Nothing here panics or fails a compile.
//!
//! **Byte-identical plans.** Only results that do not depend on the clock are stored (a
//! frontier none of whose instances ran out of time), so a compile from the cache writes the
//! same plan as one that solves (tested: `hcclc/tests/it/synth_cache.rs`).

use std::path::{Path, PathBuf};

/// The format tag of every entry; bumped whenever what an entry holds, or what a solver
/// returns for the same input, changes.
pub const FORMAT: &str = "hccl-synth-cache 2";

/// The cache directory: `$HCCL_CACHE_DIR`, else `$XDG_CACHE_HOME/hccl`, else
/// `$HOME/.cache/hccl` (empty values are unset); `None` when none of them is set.
pub fn default_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("HCCL_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("hccl"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".cache").join("hccl"))
}

/// The content address of an entry of `kind` whose result is a function of `input` alone.
pub fn key(kind: &str, input: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    for part in [
        FORMAT.as_bytes(),
        env!("CARGO_PKG_VERSION").as_bytes(),
        // microlp and HiGHS may return different optima (vertices, dives) for one input.
        crate::lp::NAME.as_bytes(),
        kind.as_bytes(),
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(input);
    h.finalize().to_hex().to_string()
}

fn entry_path(dir: &Path, key: &str) -> PathBuf {
    area_path(dir, "synth", key)
}

/// Where the entry `key` of `area` (a subdirectory: `synth`, `plans`) lives in `dir`.
pub(crate) fn area_path(dir: &Path, area: &str, key: &str) -> PathBuf {
    dir.join(area).join(format!("{key}.json"))
}

/// The payload stored under `key` in `dir`, when there is a whole, intact entry: the first
/// line is [`FORMAT`] and the key, the second the payload's blake3 hash, the rest the
/// payload.
pub fn load(dir: &Path, key: &str) -> Option<Vec<u8>> {
    load_entry(&entry_path(dir, key), key)
}

/// The payload of the entry file at `path`, stored under `key` (see [`load`]).
pub(crate) fn load_entry(path: &Path, key: &str) -> Option<Vec<u8>> {
    let (bytes, start) = load_entry_in_place(path, key)?;
    Some(bytes[start..].to_vec())
}

/// The entry file at `path`, stored under `key`, whole and intact, and where its payload
/// starts in it (a large payload is not copied out).
pub(crate) fn load_entry_in_place(path: &Path, key: &str) -> Option<(Vec<u8>, usize)> {
    let bytes = std::fs::read(path).ok()?;
    let mut parts = bytes.splitn(3, |&b| b == b'\n');
    let head = parts.next()?;
    let sum = parts.next()?;
    let payload = parts.next()?;
    if head != format!("{FORMAT} {key}").as_bytes()
        || sum != blake3::hash(payload).to_hex().as_bytes()
    {
        return None;
    }
    let start = bytes.len() - payload.len();
    Some((bytes, start))
}

/// Stores `payload` under `key` in `dir` (atomically; see the module docs). A failure is
/// returned for whoever wants to report it; the compile goes on without the entry.
pub fn store(dir: &Path, key: &str, payload: &[u8]) -> std::io::Result<()> {
    store_entry(&entry_path(dir, key), key, payload)
}

/// Writes `payload` under `key` to the entry file at `path` (see [`store`]).
pub(crate) fn store_entry(path: &Path, key: &str, payload: &[u8]) -> std::io::Result<()> {
    store_entry_parts(path, key, &[payload])
}

/// [`store_entry`] of the payload made of `parts`, one after the other (not copied into one).
pub(crate) fn store_entry_parts(path: &Path, key: &str, parts: &[&[u8]]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut sum = blake3::Hasher::new();
    for part in parts {
        sum.update(part);
    }
    let head = format!("{FORMAT} {key}\n{}\n", sum.finalize().to_hex());
    // Written beside its name and renamed over it, so a reader sees a whole entry or none.
    // Not synced to the disk: an entry a crash leaves short fails its checksum and is a
    // miss, and the sync of a plan-sized entry would cost a compile a good part of a second.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}-{n}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        use std::io::Write;
        let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        file.write_all(head.as_bytes())?;
        for part in parts {
            file.write_all(part)?;
        }
        file.into_inner().map_err(|e| e.into_error())?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The areas of a cache directory: the synthesis cache's and the plan cache's.
pub const AREAS: [&str; 2] = ["synth", "plans"];

/// What one area of a cache directory holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AreaUsage {
    pub area: &'static str,
    /// Entries (temporary files a crash left behind included).
    pub entries: usize,
    pub bytes: u64,
}

/// What each of [`AREAS`] of `dir` holds (an area that does not exist holds nothing).
pub fn usage(dir: &Path) -> Vec<AreaUsage> {
    AREAS
        .iter()
        .map(|&area| {
            let (mut entries, mut bytes) = (0, 0);
            if let Ok(read) = std::fs::read_dir(dir.join(area)) {
                for meta in read.flatten().filter_map(|e| e.metadata().ok()) {
                    if meta.is_file() {
                        entries += 1;
                        bytes += meta.len();
                    }
                }
            }
            AreaUsage {
                area,
                entries,
                bytes,
            }
        })
        .collect()
}

/// Removes every entry of `area` (one of [`AREAS`]) in `dir`; what it removed. Entries
/// another compile writes meanwhile may stay; a compile that reads one removed under it
/// misses and searches.
pub fn clear(dir: &Path, area: &str) -> std::io::Result<AreaUsage> {
    let Some(&area) = AREAS.iter().find(|&&a| a == area) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("no cache area {area:?} (known: {})", AREAS.join(", ")),
        ));
    };
    let mut removed = AreaUsage {
        area,
        entries: 0,
        bytes: 0,
    };
    let read = match std::fs::read_dir(dir.join(area)) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(e),
    };
    for entry in read.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() && std::fs::remove_file(entry.path()).is_ok() {
            removed.entries += 1;
            removed.bytes += meta.len();
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "hccl-synth-cache-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn stores_and_loads_by_content() {
        let dir = temp_dir("roundtrip");
        let a = key("test", b"input a");
        let b = key("test", b"input b");
        assert_ne!(a, b);
        assert_ne!(a, key("other", b"input a"));
        assert_eq!(load(&dir, &a), None);
        store(&dir, &a, b"{\"x\": 1}").unwrap();
        assert_eq!(load(&dir, &a).as_deref(), Some(&b"{\"x\": 1}"[..]));
        assert_eq!(load(&dir, &b), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn usage_counts_and_clear_empties_one_area() {
        let dir = temp_dir("usage");
        assert!(usage(&dir).iter().all(|u| u.entries == 0 && u.bytes == 0));
        store(&dir, &key("test", b"a"), b"12345").unwrap();
        store(&dir, &key("test", b"b"), b"12345").unwrap();
        store_entry(&area_path(&dir, "plans", "k"), "k", b"plan").unwrap();
        let used = usage(&dir);
        assert_eq!((used[0].area, used[0].entries), ("synth", 2));
        assert_eq!((used[1].area, used[1].entries), ("plans", 1));
        assert!(used[0].bytes > 10);
        let removed = clear(&dir, "plans").unwrap();
        assert_eq!((removed.entries, removed.bytes), (1, used[1].bytes));
        assert_eq!(usage(&dir)[1].entries, 0);
        assert_eq!(usage(&dir)[0].entries, 2, "the other area stays");
        assert_eq!(clear(&dir, "plans").unwrap().entries, 0);
        assert!(clear(&dir, "../x").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A truncated, edited or foreign entry reads as absent, never as data.
    #[test]
    fn damaged_entries_are_ignored() {
        let dir = temp_dir("damaged");
        let k = key("test", b"input");
        store(&dir, &k, b"{\"payload\": [1, 2, 3]}").unwrap();
        let path = entry_path(&dir, &k);
        let whole = std::fs::read(&path).unwrap();
        for cut in [0, 10, whole.len() / 2, whole.len() - 1] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            assert_eq!(load(&dir, &k), None, "truncated at {cut}");
        }
        let mut edited = whole.clone();
        *edited.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &edited).unwrap();
        assert_eq!(load(&dir, &k), None);
        // Another key's entry under this name.
        let other = key("test", b"other");
        store(&dir, &other, b"{}").unwrap();
        std::fs::copy(entry_path(&dir, &other), &path).unwrap();
        assert_eq!(load(&dir, &k), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

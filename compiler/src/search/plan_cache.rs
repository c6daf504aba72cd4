//! The plan cache: whole compiles kept between runs, so that compiling the same topology
//! with the same options again (every CI run of a job's repository, a script that compiles
//! before each launch) reads the plan instead of searching for it.
//!
//! **Content-addressed.** An entry's name hashes everything the compile's result depends on:
//! the compiler's build fingerprint (the sources of this crate, `hccl-ir` and
//! `hccl-topologies`, the lock file and the features, hashed by `build.rs`), the topology's
//! canonical hash (calibration included), every option that steers the search, and the
//! contents of external candidates. A change to any of them is another name; an entry is
//! never stale, and another build of the compiler never reads it.
//!
//! **What is kept.** The plan's text exactly as a compile writes it, its table rows and the
//! report of the search that made it. Only whole compiles whose result does not depend on the
//! clock are stored: none of their solves stopped at a time limit ([`crate::clock`]), and no
//! collective was left out. So a plan read from the cache is byte for byte the plan a fresh
//! compile writes (tested in `hcclc/tests/it/plan_cache.rs`).
//!
//! **Where and how safe.** Beside the synthesis cache ([`crate::synth::cache`]), under
//! `plans/`, with the same entry format: written to a temporary file and renamed, checked
//! against its blake3 sum when read; an entry that is damaged or cannot be read is a miss,
//! never an error. The area is kept under [`MAX_BYTES`]: a read entry is touched, and after a
//! store the least recently used entries go until the area holds 3/4 of it.

use super::options::Options;
use super::report::SearchReport;
use super::row::Row;
use hccl_topologies::Topology;
use std::path::Path;

/// The subdirectory of the cache directory that holds plans.
pub const AREA: &str = "plans";
/// The most the plan area holds (bytes); a compile bigger than a quarter of it is not kept.
pub const MAX_BYTES: u64 = 1 << 30;

/// One compile as the cache keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedCompile {
    /// The plan file's text ([`hccl_ir::PlanFile::to_ron`]).
    pub plan_text: String,
    /// The compile table's rows.
    pub rows: Vec<Row>,
    /// The report of the search that made the entry.
    pub report: SearchReport,
}

/// An entry's first line, as read.
#[derive(serde::Deserialize)]
struct Meta {
    rows: Vec<Row>,
    report: SearchReport,
}

/// An entry's first line, as written (the same fields, borrowed).
#[derive(serde::Serialize)]
struct MetaRef<'a> {
    rows: &'a [Row],
    report: &'a SearchReport,
}

/// The name of the entry for compiling `topo` with `options`; `extra` identifies
/// [`Options::extra`] (the bytes of the files or plans its candidates were read from).
/// `None` when the compile cannot be named: external candidates without their identity.
/// [`Options::cancel`] and [`Options::cache_dir`] are not part of it (a cancelled compile
/// has no result to keep; the synthesis cache never changes a plan).
pub fn key(topo: &Topology, options: &Options, extra: Option<&[u8]>) -> Option<String> {
    let extra = match (options.extra.is_empty(), extra) {
        (true, _) => &[][..],
        (false, Some(bytes)) => bytes,
        (false, None) => return None,
    };
    let mut input = Vec::new();
    let mut part = |bytes: &[u8]| {
        input.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        input.extend_from_slice(bytes);
    };
    part(env!("PLAN_CACHE_FINGERPRINT").as_bytes());
    part(topo.hash.as_bytes());
    // Debug forms: exact for floats (shortest round-trip), and fixed by the fingerprint.
    part(format!("{:?}", options.collectives).as_bytes());
    part(format!("{:?}", options.sizes).as_bytes());
    part(format!("{:?}", options.algorithms).as_bytes());
    part(format!("{:?}", options.protocols).as_bytes());
    part(format!("{:?}", options.model).as_bytes());
    part(
        format!(
            "{} {:?} {}",
            options.sim_budget, options.synth, options.partial
        )
        .as_bytes(),
    );
    part(format!("{} external candidates", options.extra.len()).as_bytes());
    part(extra);
    Some(crate::synth::cache::key("plan", &input))
}

/// The compile stored under `key` in `dir`, when a whole, intact entry is there (it is
/// then marked as just used).
pub fn load(dir: &Path, key: &str) -> Option<CachedCompile> {
    let path = crate::synth::cache::area_path(dir, AREA, key);
    let (mut bytes, start) = crate::synth::cache::load_entry_in_place(&path, key)?;
    let cut = start + bytes[start..].iter().position(|&b| b == b'\n')?;
    let meta: Meta = ron::de::from_bytes(&bytes[start..cut]).ok()?;
    bytes.drain(..=cut);
    let plan_text = String::from_utf8(bytes).ok()?;
    if let Ok(file) = std::fs::File::options().write(true).open(&path) {
        let _ = file.set_modified(std::time::SystemTime::now());
    }
    Some(CachedCompile {
        plan_text,
        rows: meta.rows,
        report: meta.report,
    })
}

/// Stores a compile (its plan's text, rows and report; what [`load`] gives back) under `key`
/// in `dir` (atomically), then trims the area to [`MAX_BYTES`]. A compile over a quarter of
/// it is not stored (`Ok(false)`).
pub fn store(
    dir: &Path,
    key: &str,
    plan_text: &str,
    rows: &[Row],
    report: &SearchReport,
) -> std::io::Result<bool> {
    let meta = ron::to_string(&MetaRef { rows, report }).map_err(std::io::Error::other)?;
    if meta.contains('\n') {
        return Err(std::io::Error::other(
            "the rows serialise over several lines",
        ));
    }
    if (meta.len() + plan_text.len()) as u64 > MAX_BYTES / 4 {
        return Ok(false);
    }
    let path = crate::synth::cache::area_path(dir, AREA, key);
    crate::synth::cache::store_entry_parts(
        &path,
        key,
        &[meta.as_bytes(), b"\n", plan_text.as_bytes()],
    )?;
    trim(&dir.join(AREA), MAX_BYTES);
    Ok(true)
}

/// Removes the least recently used entries of `area` until it holds 3/4 of `max` bytes,
/// when it holds more than `max`. Entries another compile removes meanwhile are skipped.
fn trim(area: &Path, max: u64) {
    let Ok(read) = std::fs::read_dir(area) else {
        return;
    };
    let mut entries: Vec<(std::time::SystemTime, u64, std::path::PathBuf)> = read
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    if total <= max {
        return;
    }
    entries.sort();
    for (_, len, path) in entries {
        if total <= max / 4 * 3 {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::FamilyParams;
    use hccl_ir::{CollectiveKind, Protocol};

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "hccl-plan-cache-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn row(us: f64) -> Row {
        Row {
            collective: CollectiveKind::AllReduce,
            bytes: 1024,
            algorithm: "ring".into(),
            params: FamilyParams {
                channels: 2,
                pipeline: 1,
            },
            channels: 2,
            chunks: 16,
            protocol: Protocol::LL,
            predicted_us: us,
            baseline_algorithm: Some("tree".into()),
            baseline_protocol: Some(Protocol::Simple),
            baseline_us: None,
            baseline_modelled: false,
            bound_us: f64::INFINITY,
            nranks: 8,
            synthesis: None,
        }
    }

    #[test]
    fn an_entry_reads_back_exactly() {
        let dir = temp_dir("roundtrip");
        let compile = CachedCompile {
            plan_text: "(format_version: 1,\n  entries: [])\n".into(),
            // Values whose decimal forms are long, and a bound that is not finite.
            rows: vec![row(0.1 + 0.2), row(1.0 / 3.0)],
            report: SearchReport {
                collectives: Vec::new(),
                wall_s: 0.123456789,
            },
        };
        assert_eq!(load(&dir, "k"), None);
        let stored = store(
            &dir,
            "k",
            &compile.plan_text,
            &compile.rows,
            &compile.report,
        );
        assert!(stored.unwrap());
        assert_eq!(load(&dir, "k").as_ref(), Some(&compile));
        // A damaged entry is a miss.
        let path = crate::synth::cache::area_path(&dir, AREA, "k");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert_eq!(load(&dir, "k"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_input_changes_the_key() {
        let topo = hccl_topologies::shipped_by_name("dgx1-v100").unwrap();
        let base = Options::default();
        let k = key(&topo, &base, None).unwrap();
        assert_eq!(key(&topo, &base, None).unwrap(), k, "the key is a function");
        let other = hccl_topologies::shipped_by_name("dgx-a100").unwrap();
        let mut keys = vec![k, key(&other, &base, None).unwrap()];
        type Change = Box<dyn Fn(&mut Options)>;
        let variants: Vec<Change> = vec![
            Box::new(|o| o.collectives = vec![CollectiveKind::AllReduce]),
            Box::new(|o| o.sizes.pop().map(drop).unwrap_or(())),
            Box::new(|o| o.algorithms = Some(vec!["ring".into()])),
            Box::new(|o| o.protocols = vec![Protocol::Simple]),
            Box::new(|o| o.sim_budget += 1),
            Box::new(|o| o.synth = crate::synth::SynthLevel::Off),
            Box::new(|o| o.partial = !o.partial),
            Box::new(|o| o.model.net_gap_us += 1.0),
        ];
        for change in &variants {
            let mut options = base.clone();
            change(&mut options);
            keys.push(key(&topo, &options, None).unwrap());
        }
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "{keys:?}");
        // External candidates are named by what the caller says they were read from.
        let mut with = base.clone();
        let entry = crate::search::compile(
            &topo,
            &Options {
                collectives: vec![CollectiveKind::AllGather],
                sizes: vec![1024],
                algorithms: Some(vec!["ring".into()]),
                ..Options::default()
            },
        )
        .unwrap()
        .plan
        .entries
        .remove(0);
        with.extra = vec![crate::families::Candidate::imported(entry)];
        assert_eq!(key(&topo, &with, None), None);
        let a = key(&topo, &with, Some(b"file a")).unwrap();
        assert!(!keys.contains(&a));
        assert_ne!(a, key(&topo, &with, Some(b"file b")).unwrap());
    }

    #[test]
    fn the_area_keeps_the_most_recently_used_entries() {
        let dir = temp_dir("trim");
        std::fs::create_dir_all(&dir).unwrap();
        let t0 = std::time::SystemTime::now();
        for i in 0..8u64 {
            let path = dir.join(format!("{i}.json"));
            std::fs::write(&path, vec![b'x'; 100]).unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(t0 - std::time::Duration::from_secs(100 - i))
                .unwrap();
        }
        trim(&dir, 1000);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            8,
            "under the limit"
        );
        trim(&dir, 500);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        // 800 bytes over 500: the oldest go until 3/4 of 500 is left.
        assert_eq!(left, ["5.json", "6.json", "7.json"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

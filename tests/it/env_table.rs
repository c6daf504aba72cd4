//! `docs/env.md` lists every `HCCL_*` variable the sources read, and nothing else: the names
//! in its table are compared with the names read by the workspace's Rust sources, the Python
//! package (`python/hccl/*.py`) and the test scripts (`scripts/*.sh`, `.ci/run`).
//!
//! A name counts as read where it is a whole string literal (`"HCCL_PLAN"`, `'HCCL_PLAN'`:
//! how `std::env::var`, `os.environ`, a `const` holding the name or a child's `.env(…)` name
//! it), or, in shell, where it is expanded (`$HCCL_X`, `${HCCL_X…}`). Mentions in comments
//! and messages (`` `HCCL_PLAN` ``, `"HCCL_TIMEOUT={v}: …"`) are not reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The file holding the list of known names itself (every name as a literal), and this one.
const NOT_SCANNED: [&str; 2] = ["executor/src/env_vars.rs", "tests/it/env_table.rs"];

/// Whether `c` may continue a variable name.
fn name_char(c: u8) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_'
}

/// Where the name starting with `HCCL_` at `i` of `b` ends.
fn name_end(b: &[u8], i: usize) -> usize {
    (i + 5..b.len())
        .find(|&j| !name_char(b[j]))
        .unwrap_or(b.len())
}

/// The `HCCL_*` names that occur in `text` as whole string literals (quoted by `"` or `'`).
fn literal_names(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("HCCL_") {
        let Some(&open) = i.checked_sub(1).and_then(|j| b.get(j)) else {
            continue;
        };
        if open != b'"' && open != b'\'' {
            continue;
        }
        let end = name_end(b, i);
        if end > i + 5 && b.get(end) == Some(&open) {
            out.insert(text[i..end].to_string());
        }
    }
    out
}

/// The `HCCL_*` names a shell script expands (`$NAME`, `${NAME…}`).
fn shell_names(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("HCCL_") {
        let expanded = match i.checked_sub(1).map(|j| b[j]) {
            Some(b'$') => true,
            Some(b'{') => i >= 2 && b[i - 2] == b'$',
            _ => false,
        };
        let end = name_end(b, i);
        if expanded && end > i + 5 {
            out.insert(text[i..end].to_string());
        }
    }
    out
}

/// Every `*.rs` file under `dir`, skipping build outputs and hidden directories.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// Files directly in `dir` whose names end with `suffix`.
fn files_in(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.to_string_lossy().ends_with(suffix))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Every name the sources read, with the files that read it (relative to the root).
fn names_read() -> BTreeMap<String, Vec<String>> {
    let root = root();
    let mut rust = Vec::new();
    for dir in [
        "ir",
        "topologies",
        "compiler",
        "executor",
        "hcclc",
        "hccl-perf",
        "src",
        "tests",
        "examples",
        "python/src",
    ] {
        rust_files(&root.join(dir), &mut rust);
    }
    let python = files_in(&root.join("python/hccl"), ".py");
    let mut shell = files_in(&root.join("scripts"), ".sh");
    shell.push(root.join(".ci/run"));
    assert!(rust.len() > 50, "found only {} Rust files", rust.len());
    assert!(!python.is_empty(), "no python/hccl/*.py");
    let mut read: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let scan = |files: &[PathBuf],
                names: fn(&str) -> BTreeSet<String>,
                read: &mut BTreeMap<String, Vec<String>>| {
        for path in files {
            let rel = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .to_string_lossy()
                .replace('\\', "/");
            if NOT_SCANNED.contains(&rel.as_str()) {
                continue;
            }
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            for name in names(&text) {
                read.entry(name).or_default().push(rel.clone());
            }
        }
    };
    scan(&rust, literal_names, &mut read);
    scan(&python, literal_names, &mut read);
    scan(&shell, shell_names, &mut read);
    read
}

/// The variables of `docs/env.md`'s table, in order (its rows start with the name).
fn table_names() -> Vec<String> {
    let path = root().join("docs/env.md");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.strip_prefix("| `HCCL_"))
        .map(|rest| {
            let name: String = rest.chars().take_while(|&c| c != '`').collect();
            format!("HCCL_{name}")
        })
        .collect()
}

#[test]
fn scanner_tells_reads_from_mentions() {
    let rust = r#"
        // `HCCL_COMMENT` is only mentioned, and so is "HCCL_MESSAGE={v}: bad".
        let a = std::env::var("HCCL_READ_1");
        const B: &str = "HCCL_READ_2";
        let prefix = "HCCL_";
    "#;
    let names: Vec<String> = literal_names(rust).into_iter().collect();
    assert_eq!(names, ["HCCL_READ_1", "HCCL_READ_2"]);
    let py = "os.environ.get('HCCL_PY') # ``HCCL_DOC``";
    assert_eq!(
        literal_names(py).into_iter().collect::<Vec<_>>(),
        ["HCCL_PY"]
    );
    let sh = "# HCCL_NOTE=1 sets\nx=${HCCL_A:-0}; y=$HCCL_B; HCCL_SET=1 cmd";
    let names: Vec<String> = shell_names(sh).into_iter().collect();
    assert_eq!(names, ["HCCL_A", "HCCL_B"]);
}

#[test]
fn env_table_lists_exactly_the_variables_read() {
    let table = table_names();
    assert!(table.len() >= 20, "docs/env.md: only {} rows", table.len());
    let mut seen = BTreeSet::new();
    for name in &table {
        assert!(seen.insert(name), "docs/env.md lists {name} twice");
    }
    let read = names_read();
    let missing: Vec<String> = read
        .iter()
        .filter(|(name, _)| !seen.contains(name))
        .map(|(name, files)| format!("{name} (read in {})", files.join(", ")))
        .collect();
    assert!(
        missing.is_empty(),
        "variables read but not in docs/env.md's table: {missing:#?}"
    );
    let unread: Vec<&String> = table.iter().filter(|n| !read.contains_key(*n)).collect();
    assert!(
        unread.is_empty(),
        "docs/env.md lists variables no source reads: {unread:?}"
    );
}

#[test]
fn the_executors_known_names_are_the_table() {
    let table: BTreeSet<String> = table_names().into_iter().collect();
    let known: BTreeSet<String> = hccl::executor::env_vars::KNOWN_VARS
        .iter()
        .map(|s| s.to_string())
        .collect();
    let not_known: Vec<&String> = table.difference(&known).collect();
    let not_in_table: Vec<&String> = known.difference(&table).collect();
    assert!(
        not_known.is_empty() && not_in_table.is_empty(),
        "docs/env.md but not hccl_executor::env_vars::KNOWN_VARS: {not_known:?}; \
         KNOWN_VARS but not docs/env.md: {not_in_table:?}"
    );
}

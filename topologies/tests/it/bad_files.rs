//! Every file of `tests/bad/` is rejected with an error that names the file and either a
//! `line:col` or the offending item; all messages are snapshotted.

use hccl_topologies::load;
use std::path::{Path, PathBuf};

fn bad_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        .collect();
    files.sort();
    files
}

/// `(file name, what the message must mention besides the file name)`; `None` means a
/// `line:col` position is required.
const EXPECTED: &[(&str, Option<&str>)] = &[
    ("binary_garbage.ron", Some("not a text file")),
    (
        "calibration_knots_unordered.ron",
        Some("1024 B follows 4096 B"),
    ),
    ("calibration_zero_scale.ron", Some("message_scale")),
    ("comments_only.ron", Some("empty topology file")),
    ("deep_nesting.ron", None),
    ("duplicate_host_device_id.ron", Some("\"h0\"")),
    ("duplicate_id.ron", Some("\"g0\"")),
    ("duplicate_rank.ron", Some("rank 1")),
    ("empty.ron", Some("empty topology file")),
    ("huge_count.ron", None),
    ("huge_float.ron", Some("inf")),
    ("infinite_bw_product.ron", Some("bw × count")),
    ("latin1.ron", Some("not a text file")),
    ("missing_field.ron", None),
    ("nan_latency.ron", Some("latency")),
    ("negative_bw.ron", Some("-25")),
    ("negative_latency.ron", Some("latency")),
    ("negative_mem_bw.ron", Some("\"g0\"")),
    ("nic_negative_latency.ron", Some("latency")),
    ("nic_not_network_kind.ron", Some("Memory")),
    ("nic_zero_bw.ron", Some("\"nic0\"")),
    ("no_devices.ron", Some("no devices")),
    ("non_dense_ranks.ron", Some("\"g1\"")),
    ("partial_ranks.ron", Some("\"g1\"")),
    ("self_loop.ron", Some("\"g1\"")),
    ("truncated.ron", None),
    ("unknown_endpoint.ron", Some("\"g9\"")),
    ("unknown_field.ron", None),
    ("unknown_kind.ron", None),
    ("unknown_switch_host.ron", Some("\"h9\"")),
    ("unreachable.ron", Some("\"g2\"")),
    ("wrong_type.ron", None),
    ("zero_bw.ron", Some("bw")),
    ("zero_count.ron", Some("count")),
];

/// True when `msg` holds `name:LINE:COL`.
fn has_position(msg: &str, name: &str) -> bool {
    let Some(i) = msg.find(&format!("{name}:")) else {
        return false;
    };
    let rest = &msg[i + name.len() + 1..];
    let mut parts = rest.splitn(3, ':');
    let line = parts.next().unwrap_or("");
    let col = parts.next().unwrap_or("");
    !line.is_empty()
        && line.chars().all(|c| c.is_ascii_digit())
        && !col.is_empty()
        && col.chars().all(|c| c.is_ascii_digit())
}

#[test]
fn every_bad_file_is_rejected_with_context() {
    let files = bad_files();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let listed: Vec<&str> = EXPECTED.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, listed, "tests/bad and EXPECTED list the same files");
    let mut report = String::new();
    for (path, (name, mention)) in files.iter().zip(EXPECTED) {
        let err = match load(path) {
            Ok(_) => panic!("{name} was accepted"),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert!(
            msg.contains(name),
            "{name}: message lacks the file name: {msg}"
        );
        match mention {
            None => assert!(has_position(&msg, name), "{name}: no line:col in {msg}"),
            Some(m) => assert!(msg.contains(m), "{name}: {msg:?} does not mention {m:?}"),
        }
        let dir = path.parent().unwrap().display().to_string();
        report.push_str(&msg.replace(&dir, "tests/bad"));
        report.push('\n');
    }
    insta::assert_snapshot!(report);
}

#[test]
fn semantic_errors_point_at_the_item() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad");
    for (name, pos) in [
        ("unknown_endpoint.ron", "7:5"),
        ("zero_bw.ron", "7:5"),
        ("self_loop.ron", "8:5"),
        ("duplicate_id.ron", "4:54"),
        ("unreachable.ron", "4:77"),
    ] {
        let msg = load(&dir.join(name)).unwrap_err().to_string();
        assert!(msg.contains(&format!("{name}:{pos}:")), "{msg}");
    }
}

//! MSCCL interop over real files: every good file imports, verifies and survives an
//! export → import round trip; the quirks are handled as documented; damaged files are
//! rejected with located errors and never panic.

use hccl_ir::msccl::{export_xml, import_xml, load_xml};
use hccl_ir::verify::{ErrorKind, verify};
use std::path::{Path, PathBuf};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/msccl")
}

/// The files that implement their collective correctly (top level and `prebuilt/`).
fn good_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in [corpus_dir(), corpus_dir().join("prebuilt")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "xml") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert_eq!(files.len(), 27, "corpus changed: {files:?}");
    files
}

#[test]
fn every_good_file_imports_verifies_and_round_trips() {
    for path in good_files() {
        let imported = load_xml(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!imported.entries.is_empty(), "{}", path.display());
        for entry in &imported.entries {
            if let Err(errors) = verify(&entry.schedule) {
                panic!(
                    "{}: {} error(s), first: {}",
                    path.display(),
                    errors.len(),
                    errors[0]
                );
            }
            let exported = export_xml(entry).unwrap();
            let again = import_xml(&exported.xml, "round-trip.xml")
                .unwrap_or_else(|e| panic!("{}: re-import failed: {e}", path.display()));
            let twin = again
                .entries
                .iter()
                .find(|e| e.schedule.in_place == entry.schedule.in_place)
                .unwrap();
            assert_eq!(
                twin.schedule,
                entry.schedule,
                "{}: round trip changed the schedule",
                path.display()
            );
            assert_eq!(
                (twin.min_bytes, twin.max_bytes, twin.protocol),
                (entry.min_bytes, entry.max_bytes, entry.protocol)
            );
        }
    }
}

#[test]
fn export_is_byte_stable_for_generated_files() {
    // msccl-tools' own output re-exported gives the same steps: spot-check one file line by
    // line, ignoring the root tag whose attribute order differs.
    let path = corpus_dir().join("allreduce_ring_r8_ch1_i1_ll128.xml");
    let original = std::fs::read_to_string(&path).unwrap();
    let imported = import_xml(&original, "ring.xml").unwrap();
    let exported = export_xml(&imported.entries[0]).unwrap().xml;
    let body = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.trim_start().starts_with("<step") || l.trim_start().starts_with("<tb"))
            .map(|l| l.trim().to_string())
            .collect()
    };
    assert_eq!(body(&exported), body(&original));
}

#[test]
fn quirks_are_handled_as_documented() {
    let quirks = corpus_dir().join("quirks");

    // Mislabeled pipeline: imports, but is not an allreduce.
    let imported =
        load_xml(&quirks.join("not_allreduce_pipeline_ring_r16_ch1_i1_ll128.xml")).unwrap();
    let errors = verify(&imported.entries[0].schedule).unwrap_err();
    assert!(
        errors.iter().any(|e| e.kind == ErrorKind::Postcondition),
        "{errors:?}"
    );

    // Synthesized allgather that reduces uninitialised output chunks.
    let imported = load_xml(&quirks.join("bad_synth_allgather_dgx1_steps2_i2.xml")).unwrap();
    let errors = verify(&imported.entries[0].schedule).unwrap_err();
    assert!(
        errors.iter().any(
            |e| matches!(e.kind, ErrorKind::Uninitialized | ErrorKind::BadReduction)
                && e.at.is_some()
        ),
        "{errors:?}"
    );

    // Legacy header: read with documented defaults, and the defaults are reported.
    let imported =
        load_xml(&quirks.join("legacy_format_allreduce_ring_r8_ch1_i1_ll128.xml")).unwrap();
    assert_eq!(imported.entries.len(), 1);
    assert!(imported.entries[0].schedule.in_place);
    assert_eq!(imported.entries[0].max_bytes, None);
    assert_eq!(
        imported
            .warnings
            .iter()
            .filter(|w| w.starts_with("legacy format"))
            .count(),
        3,
        "{:?}",
        imported.warnings
    );
    verify(&imported.entries[0].schedule).unwrap();

    // reduce_scatter is accepted as reducescatter.
    let imported =
        load_xml(&quirks.join("synth_reducescatter_dgx1_steps2_legacy_collname.xml")).unwrap();
    assert_eq!(
        imported.entries[0].schedule.collective,
        hccl_ir::Collective::ReduceScatter
    );
    verify(&imported.entries[0].schedule).unwrap();
}

/// Damaged copies of a good file: what each must produce.
#[test]
fn damaged_files_are_rejected_with_located_errors() {
    let text =
        std::fs::read_to_string(corpus_dir().join("allreduce_ring_r8_ch1_i1_ll128.xml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let step_line = lines
        .iter()
        .position(|l| l.contains("<step s=\"3\""))
        .unwrap();

    // A step removed: the file still parses but no longer pairs up (verification, exit 1).
    let mut removed = lines.clone();
    removed.remove(step_line);
    let imported = import_xml(&removed.join("\n"), "removed.xml");
    // Removing step 3 renumbers nothing, so the importer sees a gap in `s`.
    let err = imported.unwrap_err();
    assert_eq!(err.line as usize, step_line + 1, "{err}");

    // A step removed and the rest renumbered would be a wrong algorithm: verified, not parsed.
    let gpu0_end = lines.iter().position(|l| l.contains("</tb>")).unwrap();
    let mut cut = lines.clone();
    cut.remove(gpu0_end - 1); // the last step of gpu 0's tb
    let imported = import_xml(&cut.join("\n"), "cut.xml").unwrap();
    let errors = verify(&imported.entries[0].schedule).unwrap_err();
    assert!(errors[0].at.is_some(), "{errors:?}");

    // A peer changed: send to 2 instead of 1 on gpu 0.
    let changed = text.replacen("send=\"1\" recv=\"7\"", "send=\"2\" recv=\"7\"", 1);
    let imported = import_xml(&changed, "peer.xml").unwrap();
    assert!(verify(&imported.entries[0].schedule).is_err());

    // Truncated: malformed (exit 2), located.
    for cut_at in [0, 10, text.len() / 3, text.len() - 10] {
        let err = import_xml(&text[..cut_at], "trunc.xml").unwrap_err();
        assert!(err.line >= 1 && err.col >= 1, "{err}");
    }

    // Garbage and hostile inputs never panic.
    let hostile = [
        String::new(),
        "\u{0}\u{1}\u{2}".to_string(),
        "<".repeat(100_000),
        format!("{}{}", "<algo>".repeat(20_000), "</algo>".repeat(20_000)),
        text.replace("cnt=\"1\"", "cnt=\"99999999999999999999\""),
        text.replace("ngpus=\"8\"", "ngpus=\"-8\""),
        text.replace("depid=\"-1\" deps=\"-1\"", "depid=\"0\" deps=\"-1\""),
        text.replace("srcoff=\"0\"", "srcoff=\"-5\""),
        text.replace("type=\"rrs\"", "type=\"zz\""),
    ];
    for input in hostile {
        assert!(import_xml(&input, "hostile.xml").is_err());
    }
}
#[test]
fn a_dependency_cut_is_caught_by_the_verifier() {
    // The all-pairs allreduce relies on cross-tb dependencies; cutting one races or reads
    // unwritten scratch, which the verifier must notice.
    let text =
        std::fs::read_to_string(corpus_dir().join("allreduce_allpairs_r8_i1_ll.xml")).unwrap();
    let imported = import_xml(&text, "ap.xml").unwrap();
    let mut caught = 0;
    let mut tried = 0;
    let schedule = &imported.entries[0].schedule;
    for (s, stream) in schedule.ranks[0].streams.iter().enumerate() {
        for (i, step) in stream.steps.iter().enumerate() {
            if step.deps.is_empty() || !matches!(step.op, hccl_ir::Op::Reduce { .. }) {
                continue;
            }
            let mut cut = schedule.clone();
            cut.ranks[0].streams[s].steps[i].deps.clear();
            tried += 1;
            if verify(&cut).is_err() {
                caught += 1;
            }
        }
    }
    assert!(tried > 0);
    assert_eq!(caught, tried, "cut dependencies that went unnoticed");
}

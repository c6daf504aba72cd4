//! Plan-file robustness: a corpus of bad files with located errors, and property tests that
//! the loader (and the verifier behind it) never panics or hangs on malformed input.

use hccl_ir::verify::verify_plan;
use hccl_ir::{PlanError, PlanFile};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

use crate::common;
use common::mutate::{self, Edit, apply};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad_plans")
}

fn good_texts() -> Vec<String> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    ["pair_allreduce.plan.ron", "ring_allreduce_8.plan.ron"]
        .iter()
        .map(|f| std::fs::read_to_string(data.join(f)).expect("test data present"))
        .collect()
}

/// What each corpus file must produce: `(file, line, col, message fragment)`; line 0 marks
/// errors without a position (version, encoding).
const EXPECTED: &[(&str, usize, usize, &str)] = &[
    ("bad_enum.ron", 9, 15, "variant named `Fast`"),
    ("bad_op.ron", 20, 16, "variant named `Sned`"),
    ("deep_nesting.ron", 5, 13, "Expected opening `(`"),
    (
        "empty.ron",
        1,
        1,
        "Expected opening `(` for struct `PlanFile`",
    ),
    ("float_for_int.ron", 20, 64, "Expected comma"),
    ("huge_number.ron", 14, 15, "out of bounds"),
    ("missing_field.ron", 28, 3, "missing field named `protocol`"),
    (
        "missing_version.ron",
        29,
        1,
        "missing field named `format_version`",
    ),
    ("negative_number.ron", 6, 17, "out of bounds"),
    ("newer_version.ron", 0, 0, "version 7"),
    ("not_text.ron", 0, 0, "invalid UTF-8 at byte 60"),
    ("trailing_garbage.ron", 30, 2, "trailing characters"),
    ("truncated.ron", 25, 30, "Unexpected end of RON"),
    ("unknown_field.ron", 8, 5, "field named `algoritm`"),
    ("unterminated_string.ron", 8, 17, "Expected comma"),
    ("wrong_type.ron", 13, 14, "Expected integer"),
];

fn load(file: &str) -> Result<PlanFile, PlanError> {
    let bytes = std::fs::read(corpus_dir().join(file)).expect("corpus file");
    match std::str::from_utf8(&bytes) {
        Ok(text) => PlanFile::from_ron(text, file),
        // Through the real loader, to check its encoding error.
        Err(_) => PlanFile::load(&corpus_dir().join(file)),
    }
}

#[test]
fn corpus_is_listed() {
    let mut files: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("corpus dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let listed: Vec<&str> = EXPECTED.iter().map(|e| e.0).collect();
    assert_eq!(files, listed, "every bad plan needs an expectation");
}

#[test]
fn bad_plans_fail_with_located_errors() {
    let mut report = String::new();
    for &(file, line, col, fragment) in EXPECTED {
        let err = load(file).expect_err(file);
        let msg = err.to_string();
        assert!(msg.contains(fragment), "{file}: `{msg}` lacks `{fragment}`");
        match &err {
            PlanError::Parse(loc) => {
                assert_eq!(loc.path, file);
                assert!(loc.line >= 1 && loc.col >= 1, "{file}: unlocated {msg}");
                if line > 0 {
                    assert_eq!((loc.line, loc.col), (line, col), "{file}: {msg}");
                }
            }
            PlanError::Version { .. }
            | PlanError::NotText { .. }
            | PlanError::Edited { .. }
            | PlanError::EditedRank { .. }
            | PlanError::TooLarge { .. } => {}
            PlanError::Io { .. } | PlanError::MaxSteps { .. } | PlanError::Expand { .. } => {
                panic!("{file}: {msg}")
            }
        }
        let shown = match &err {
            PlanError::NotText { offset, .. } => format!("not text at byte {offset}"),
            _ => msg,
        };
        report.push_str(&format!("{file}: {shown}\n"));
    }
    insta::assert_snapshot!(report);
}

#[test]
fn version_rejection_says_what_to_do() {
    let err = load("newer_version.ron").expect_err("newer version");
    assert!(matches!(
        err,
        PlanError::Version {
            found: 7,
            supported: hccl_ir::FORMAT_VERSION,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "newer_version.ron: plan format version 7 is not supported by this build (it reads versions 1 to 6); recompile the plan with a matching hcclc"
    );
}

#[test]
fn deep_nesting_does_not_overflow() {
    for open in ["[", "(", "{", "Some("] {
        let text = open.repeat(10_000);
        assert!(PlanFile::from_ron(&text, "deep").is_err());
        let prefixed = format!(
            "(format_version: 1, meta: (topology: \"t\", compiler: \"c\"), entries: {text}"
        );
        assert!(PlanFile::from_ron(&prefixed, "deep").is_err());
    }
}

/// Parses `text`; whatever parses must also survive the verifier.
fn parse_and_verify(text: &str) {
    if let Ok(plan) = PlanFile::from_ron(text, "fuzz") {
        let _ = verify_plan(&plan);
        let _ = plan.to_ron();
    }
}

/// Hostile insertions for plan texts.
fn edit() -> impl Strategy<Value = Edit> {
    mutate::edit(vec![
        "[".repeat(300),
        "(".repeat(300),
        "99999999999999999999".to_string(),
        "-1".to_string(),
        "\"".to_string(),
        "None".to_string(),
        "1.5e308".to_string(),
        ",".to_string(),
        "Send(to: 0, src: (buf: Scratch, off: 4294967295))".to_string(),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        parse_and_verify(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn arbitrary_ron_like_text_never_panics(text in "[\\[\\](){}:,a-zA-Z0-9_\" .-]{0,300}") {
        parse_and_verify(&text);
    }

    #[test]
    fn mutated_plans_never_panic(which in 0usize..2, edits in proptest::collection::vec(edit(), 1..4)) {
        let texts = good_texts();
        parse_and_verify(&apply(&texts[which], &edits));
    }
}

/// Mutations that keep the text parseable reach the verifier: check that some do, so the
/// property above is not only exercising the parser.
#[test]
fn digit_mutations_reach_the_verifier() {
    let text = &good_texts()[0];
    let mut parsed = 0;
    let mut rejected = 0;
    for i in (0..text.len()).step_by(7) {
        for digits in ["0", "2", "3", "4294967295"] {
            let mutated = apply(text, &[Edit::Digits(i, digits.to_string())]);
            if let Ok(plan) = PlanFile::from_ron(&mutated, "m") {
                parsed += 1;
                if verify_plan(&plan).is_err() {
                    rejected += 1;
                }
            }
        }
    }
    assert!(parsed > 50, "only {parsed} mutants parsed");
    assert!(
        rejected > parsed / 3,
        "{rejected} of {parsed} parsed mutants rejected"
    );
}

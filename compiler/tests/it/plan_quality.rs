//! Plans never get slower: every shipped machine's default plan (what `hcclc compile MACHINE`
//! writes) predicts, at every size of every collective, no more time than the plan compiled
//! before the compile-speed work of issue 37 (`data/plan_times.tsv`, from `hcclc compile
//! --json` at commit 2f74c3d). A faster search must find the same winners or better ones.
//!
//! The 8-rank machines run by default; the 16- and 32-rank ones take minutes unoptimised and
//! are `#[ignore]`d (`cargo test --release -p hccl-compiler --test it plan_quality --
//! --ignored`).

use crate::cost_common::par_each;
use hccl_compiler::search::{self, Options};
use std::collections::BTreeMap;

/// `(collective, bytes) → (predicted µs, algorithm)` per machine, from the table.
fn table() -> BTreeMap<String, Vec<(String, u64, f64, String)>> {
    let text = include_str!("data/plan_times.tsv");
    let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 5, "bad line {line:?}");
        out.entry(f[0].to_string()).or_default().push((
            f[1].to_string(),
            f[2].parse().expect("bytes"),
            f[3].parse().expect("µs"),
            f[4].to_string(),
        ));
    }
    out
}

/// Compiles `machine` as `hcclc compile` does by default and checks every row against the
/// table's.
fn check(machine: &str, rows: &[(String, u64, f64, String)]) {
    let topo = hccl_topologies::shipped_by_name(machine).expect("a shipped machine");
    let options = Options {
        model: hccl_compiler::cost::CostModel::for_topology(&topo),
        partial: true,
        ..Options::default()
    };
    let compiled = search::compile(&topo, &options).expect("compiles");
    assert_eq!(compiled.rows.len(), rows.len(), "{machine}: rows");
    let mut worse = Vec::new();
    for (row, (collective, bytes, before, algorithm)) in compiled.rows.iter().zip(rows) {
        assert_eq!(
            (row.collective.name(), row.bytes),
            (collective.as_str(), *bytes),
            "{machine}: rows out of order"
        );
        // The table has the JSON's rounding (three decimals).
        if row.predicted_us > before + 5e-4 + before * 1e-9 {
            worse.push(format!(
                "{collective} {bytes} B: {} {:.3} µs, was {algorithm} {before} µs",
                row.algorithm, row.predicted_us
            ));
        }
    }
    assert!(
        worse.is_empty(),
        "{machine} got slower:\n{}",
        worse.join("\n")
    );
}

fn check_machines(small: bool) {
    let table = table();
    let machines: Vec<(&String, &Vec<_>)> = table
        .iter()
        .filter(|(m, _)| {
            let n = hccl_topologies::shipped_by_name(m)
                .expect("a shipped machine")
                .nranks();
            (n <= 8) == small
        })
        .collect();
    assert!(!machines.is_empty());
    par_each(&machines, |(machine, rows)| check(machine, rows));
}

/// Every shipped machine is in the table.
#[test]
fn table_lists_every_shipped_machine() {
    let table = table();
    for (name, _) in hccl_topologies::shipped() {
        assert!(table.contains_key(*name), "{name} missing from the table");
    }
}

#[test]
fn eight_rank_machines_are_as_fast_as_before() {
    check_machines(true);
}

#[test]
#[ignore = "minutes unoptimised: run with --release"]
fn cluster_machines_are_as_fast_as_before() {
    check_machines(false);
}

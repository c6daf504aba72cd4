//! Every plan the compiler emits for the shipped 8-GPU machines exports to MSCCL XML and
//! re-imports to an equivalent plan: the same schedule when no stream had to be split into
//! several thread blocks, otherwise one that verifies and keeps every step in order.

use hccl_compiler::search::{self, Options};
use hccl_ir::msccl::{export_xml, import_xml};
use hccl_ir::{Dep, Op, Schedule};
use std::collections::{HashMap, HashSet};

/// Per rank, every non-nop op with its count, sorted: what splitting streams must preserve.
fn ops_per_rank(s: &Schedule) -> Vec<Vec<String>> {
    s.ranks
        .iter()
        .map(|r| {
            let mut ops: Vec<String> = r
                .streams
                .iter()
                .flat_map(|st| &st.steps)
                .filter(|x| x.op != Op::Nop)
                .map(|x| format!("{:?} x{}", x.op, x.count))
                .collect();
            ops.sort();
            ops
        })
        .collect()
}

/// The schedule with MSCCL's dependency encoding undone: a `nop` nothing waits on is folded
/// into the next step of its stream (whose dependencies it carried), and dependency lists are
/// sorted. Two schedules equal after this run the same steps under the same orderings.
fn fold_nops(s: &Schedule) -> Schedule {
    let mut out = s.clone();
    for program in &mut out.ranks {
        let targeted: HashSet<(u32, u32)> = program
            .streams
            .iter()
            .flat_map(|st| &st.steps)
            .flat_map(|step| step.deps.iter().map(|d| (d.stream, d.step)))
            .collect();
        let mut index: HashMap<(u32, u32), u32> = HashMap::new();
        for (si, stream) in program.streams.iter_mut().enumerate() {
            let mut steps = Vec::new();
            let mut pending: Vec<Dep> = Vec::new();
            for (i, step) in stream.steps.iter().enumerate() {
                let key = (si as u32, i as u32);
                if step.op == Op::Nop && !targeted.contains(&key) {
                    pending.extend(step.deps.iter().copied());
                    continue;
                }
                let mut step = step.clone();
                step.deps.append(&mut pending);
                index.insert(key, steps.len() as u32);
                steps.push(step);
            }
            if !pending.is_empty() {
                steps.push(hccl_ir::Step::new(Op::Nop, 0).with_deps(pending));
            }
            stream.steps = steps;
        }
        for stream in &mut program.streams {
            for step in &mut stream.steps {
                for dep in &mut step.deps {
                    dep.step = index[&(dep.stream, dep.step)];
                }
                step.deps.sort();
                step.deps.dedup();
            }
        }
    }
    out
}

#[test]
fn compiled_plans_round_trip_through_msccl_xml() {
    let mut exported = 0;
    for machine in ["dgx1-v100", "dgx-a100", "dgx-h100", "ascend910-8"] {
        let topo = hccl_topologies::shipped_by_name(machine).unwrap();
        let options = Options {
            sizes: vec![1 << 10, 1 << 20, 1 << 30],
            ..Options::default()
        };
        let compiled = search::compile(&topo, &options).unwrap();
        for entry in &compiled.plan.entries {
            let xml = export_xml(entry)
                .unwrap_or_else(|e| panic!("{machine} {}: {e}", entry.algorithm))
                .xml;
            let back = import_xml(&xml, "export.xml")
                .unwrap_or_else(|e| panic!("{machine} {}: {e}", entry.algorithm));
            let twin = back
                .entries
                .iter()
                .find(|e| e.schedule.in_place == entry.schedule.in_place)
                .unwrap();
            assert_eq!(twin.protocol, entry.protocol);
            assert_eq!(twin.min_bytes, entry.min_bytes);
            if let Err(errors) = hccl_ir::verify::verify(&twin.schedule) {
                panic!(
                    "{machine} {}: re-import does not verify: {}",
                    entry.algorithm, errors[0]
                );
            }
            if twin
                .schedule
                .ranks
                .iter()
                .map(|r| r.streams.len())
                .sum::<usize>()
                == entry
                    .schedule
                    .ranks
                    .iter()
                    .map(|r| r.streams.len())
                    .sum::<usize>()
            {
                assert_eq!(
                    fold_nops(&twin.schedule),
                    fold_nops(&entry.schedule),
                    "{machine} {}",
                    entry.algorithm
                );
            } else {
                // Split streams: the same ops on every rank.
                assert_eq!(
                    ops_per_rank(&twin.schedule),
                    ops_per_rank(&entry.schedule),
                    "{machine} {}",
                    entry.algorithm
                );
            }
            exported += 1;
        }
    }
    assert!(exported >= 24, "only {exported} entries exported");
}

/// Every MSCCL corpus file is costed by the model (on a topology of its rank count), with a
/// finite predicted time that the lower bound does not exceed.
#[test]
fn every_msccl_file_is_costed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ir/tests/data/msccl");
    let mut files = Vec::new();
    for dir in [root.clone(), root.join("prebuilt")] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "xml") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert_eq!(files.len(), 27);
    for file in files {
        let plan = hccl_ir::msccl::load_xml(&file).unwrap().into_plan("corpus");
        let n = plan.entries[0].schedule.nranks;
        let topo = match n {
            8 => hccl_topologies::shipped_by_name("dgx1-v100").unwrap(),
            16 => hccl_topologies::shipped_by_name("h100-cluster-2node").unwrap(),
            _ => hccl_topologies::build(hccl_topologies::generate::host(n, 10.0), "host").unwrap(),
        };
        // Sizes inside the range the file declares (prebuilt files carry real ranges).
        let entry = &plan.entries[0];
        let low = entry.min_bytes.max(1 << 10);
        let high = entry.max_bytes.map_or(1 << 24, |m| m - 1).max(low);
        let options = Options {
            sizes: vec![low, high],
            ..Options::default()
        };
        let rows = search::evaluate_plan(&topo, &plan, &options)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(!rows.is_empty(), "{}", file.display());
        for row in rows {
            assert!(
                row.predicted_us.is_finite() && row.predicted_us > 0.0,
                "{}: {row:?}",
                file.display()
            );
            assert!(
                row.bound_us <= row.predicted_us * (1.0 + 1e-9),
                "{}: bound {} above prediction {}",
                file.display(),
                row.bound_us,
                row.predicted_us
            );
        }
    }
}

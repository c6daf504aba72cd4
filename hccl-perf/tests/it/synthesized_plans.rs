//! `hccl-perf --check` on synthesized plans (`packed_trees`, `flow_alltoall`, `milp`) run by
//! real rank processes: the deepest parameter sets the facade's `synthesized_plans` tests run
//! in threads, every element of every call checked.

use crate::plan_builders::{candidates, params_of, plan_of, ring4, shipped};

use hccl_executor::{DataType, ReduceOp};
use hccl_ir::{Collective, PlanFile, Protocol};
use hccl_topologies::Topology;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// `hccl-perf --check` on real processes: the deepest plans the tests above run in threads.
#[test]
fn hccl_perf_checks_synthesized_plans_on_processes() {
    let dir = std::env::temp_dir().join(format!("hccl-synth-plans-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let dgx1 = shipped("dgx1-v100");
    let ring = ring4();
    let pick = |family: &str, topo: &Topology, coll: Collective, deepest: bool| {
        let params = params_of(family, topo, coll);
        let p = if deepest {
            params[params.len() - 1]
        } else {
            params[0]
        };
        let cands = candidates(family, topo, coll, p);
        let out = cands.iter().find(|c| !c.schedule.in_place);
        let inp = cands.iter().find(|c| c.schedule.in_place);
        plan_of(
            topo,
            &out.into_iter().chain(inp).collect::<Vec<_>>(),
            Protocol::Simple,
        )
    };
    let runs: Vec<(&str, PlanFile, u32, Collective, DataType, ReduceOp)> = vec![
        (
            "dgx1-broadcast",
            pick(
                "packed_trees",
                &dgx1,
                Collective::Broadcast { root: 6 },
                false,
            ),
            8,
            Collective::Broadcast { root: 6 },
            DataType::F32,
            ReduceOp::Sum,
        ),
        (
            "dgx1-reducescatter",
            pick("packed_trees", &dgx1, Collective::ReduceScatter, false),
            8,
            Collective::ReduceScatter,
            DataType::BF16,
            ReduceOp::Max,
        ),
        (
            "ring4-reduce",
            pick("packed_trees", &ring, Collective::Reduce { root: 3 }, true),
            4,
            Collective::Reduce { root: 3 },
            DataType::I32,
            ReduceOp::Sum,
        ),
        (
            "dgx1-alltoall",
            pick("flow_alltoall", &dgx1, Collective::AllToAll, false),
            8,
            Collective::AllToAll,
            DataType::U8,
            ReduceOp::Sum,
        ),
        (
            "dgx1-allreduce-milp",
            plan_of(
                &dgx1,
                &[&candidates(
                    "milp",
                    &dgx1,
                    Collective::AllReduce,
                    params_of("milp", &dgx1, Collective::AllReduce)[0],
                )[0]],
                Protocol::Simple,
            ),
            8,
            Collective::AllReduce,
            DataType::F32,
            ReduceOp::Avg,
        ),
    ];
    for (name, plan, n, coll, dtype, op) in runs {
        let path: PathBuf = dir.join(format!("{name}.plan.ron"));
        plan.save(&path).expect("plan written");
        let coll_name = hccl_ir::CollectiveKind::name(coll.kind());
        let root = coll.root().unwrap_or(0).to_string();
        let n_s = n.to_string();
        for in_place in [false, true] {
            let t = Instant::now();
            let mut args = vec![
                "--plan",
                path.to_str().expect("utf-8 path"),
                "-g",
                &n_s,
                "--backend",
                "process",
                "-c",
                coll_name,
                "-r",
                &root,
                "-d",
                dtype.name(),
                "-o",
                op.name(),
                // 24 bytes (fewer elements than chunks), 2424 and 244824 bytes, 300 KiB.
                "-b",
                "24",
                "-e",
                "300K",
                "-f",
                "101",
                "--check",
                "--json",
                "-n",
                "1",
                "-w",
                "0",
            ];
            if in_place {
                args.push("--in-place");
            }
            let out = Command::new(env!("CARGO_BIN_EXE_hccl-perf"))
                .args(&args)
                .env_remove("HCCL_PLAN")
                .env("HCCL_TIMEOUT", "60")
                .output()
                .expect("hccl-perf runs");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(0), "{name} {args:?}: {text}");
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{name}: {e}: {text}"));
            let rows = doc["rows"].as_array().expect("rows");
            assert_eq!(rows.len(), 4, "{name}: {text}");
            for row in rows {
                assert_eq!(row["wrong"], 0, "{name} in_place={in_place}: {row}");
            }
            eprintln!(
                "hccl-perf {name} in_place={in_place}: {:.2} s",
                t.elapsed().as_secs_f64()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

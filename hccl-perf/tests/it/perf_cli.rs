//! `hccl-perf` end to end: every collective checked against the reference on the threads and
//! process backends, imported MSCCL algorithms, a launcher (`mpirun`) when one is installed,
//! the JSON contract and usage errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hccl-perf"))
        .args(args)
        .env_remove("HCCL_PLAN")
        .env("HCCL_TIMEOUT", "60")
        .output()
        .expect("hccl-perf runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// Runs a checked sweep and asserts every row is present and has no wrong element.
fn assert_correct(args: &[&str], rows: usize) {
    let mut full = args.to_vec();
    full.extend_from_slice(&["--check", "--json", "-n", "1", "-w", "0"]);
    let out = perf(&full);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    let doc = json(&out);
    let got = doc["rows"].as_array().unwrap();
    assert_eq!(got.len(), rows, "{args:?}");
    for row in got {
        for key in [
            "bytes",
            "count",
            "dtype",
            "op",
            "time_us",
            "algbw_gbps",
            "busbw_gbps",
            "wrong",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        assert_eq!(row["wrong"], 0, "{args:?}: {row}");
    }
    // The run's straggler report: one per run, over its ranks.
    let st = &doc["stragglers"];
    assert_eq!(st["ranks"], doc["ranks"], "{args:?}: {st}");
    for c in st["culprits"].as_array().expect("culprits") {
        for key in [
            "rank", "host", "share", "total_s", "count", "waiters", "p99_s",
        ] {
            assert!(c.get(key).is_some(), "{key} missing in {c}");
        }
    }
}

#[test]
fn every_collective_is_correct_on_threads() {
    for coll in [
        "allreduce",
        "allgather",
        "reducescatter",
        "broadcast",
        "reduce",
        "alltoall",
    ] {
        for ranks in ["1", "3", "4"] {
            assert_correct(
                &[
                    "-c", coll, "-g", ranks, "-b", "8", "-e", "70000", "-f", "31",
                ],
                4,
            );
        }
    }
    // Every data type and operator on one collective, in place and with a non-zero root.
    for dtype in [
        "float", "double", "half", "bfloat16", "int8", "uint8", "int32", "uint32", "int64",
        "uint64",
    ] {
        for op in ["sum", "prod", "min", "max", "avg"] {
            assert_correct(
                &[
                    "-c",
                    "allreduce",
                    "-g",
                    "3",
                    "-d",
                    dtype,
                    "-o",
                    op,
                    "-b",
                    "100",
                    "-e",
                    "100",
                ],
                1,
            );
        }
    }
    assert_correct(
        &[
            "-c",
            "reduce",
            "-r",
            "2",
            "-g",
            "4",
            "-b",
            "1000",
            "-e",
            "1000",
            "--in-place",
        ],
        1,
    );
    assert_correct(
        &[
            "-c",
            "allgather",
            "-g",
            "4",
            "-b",
            "1000",
            "-e",
            "1000",
            "--in-place",
        ],
        1,
    );
    assert_correct(
        &[
            "-c",
            "reducescatter",
            "-g",
            "4",
            "-b",
            "1000",
            "-e",
            "1000",
            "--in-place",
        ],
        1,
    );
}

#[test]
fn every_collective_is_correct_on_processes() {
    for coll in [
        "allreduce",
        "allgather",
        "reducescatter",
        "broadcast",
        "reduce",
        "alltoall",
    ] {
        assert_correct(
            &[
                "--backend",
                "process",
                "-c",
                coll,
                "-g",
                "4",
                "-b",
                "8",
                "-e",
                "64K",
                "-f",
                "64",
            ],
            4,
        );
    }
}

/// AllToAllv: uniform and skewed counts (empty blocks included) checked element by element
/// on threads and on two emulated hosts; the size column is what a rank sends on average;
/// a forced relaying family (bruck) runs padded and says so in the algorithm column.
#[test]
fn alltoallv_is_correct_on_every_backend() {
    for (counts, extra) in [
        (
            "uniform",
            &["-g", "4", "-b", "8", "-e", "70000", "-f", "31"][..],
        ),
        (
            "skewed",
            &["-g", "3", "-b", "8", "-e", "70000", "-f", "31"][..],
        ),
        (
            "uniform",
            &[
                "--backend",
                "process",
                "--hosts",
                "2",
                "-g",
                "4",
                "-b",
                "8",
                "-e",
                "64K",
                "-f",
                "64",
            ][..],
        ),
    ] {
        let mut args = vec!["-c", "alltoallv", "--counts", counts, "--seed", "7"];
        args.extend_from_slice(extra);
        assert_correct(&args, 4);
    }
    let out = perf(&[
        "-c",
        "alltoallv",
        "-g",
        "4",
        "-b",
        "4K",
        "-e",
        "4K",
        "--check",
        "--json",
        "--algo",
        "bruck",
        "-n",
        "2",
        "-w",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc = json(&out);
    assert_eq!(doc["collective"], "alltoallv");
    let row = &doc["rows"][0];
    assert_eq!(row["wrong"], 0, "{row}");
    assert!(
        row["algorithm"]
            .as_str()
            .unwrap()
            .starts_with("bruck (padded)/"),
        "{row}"
    );
    let out = perf(&["-c", "alltoallv", "--in-place", "-b", "8", "-e", "8"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

fn msccl_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ir/tests/data/msccl")
}

fn attr(xml: &str, name: &str) -> String {
    let key = format!("{name}=\"");
    let start = xml.find(&key).unwrap() + key.len();
    xml[start..].split('"').next().unwrap().to_string()
}

/// Every MSCCL file runs correctly on the threads backend at sizes that are and are not
/// multiples of its chunk count, in the placement it allows.
#[test]
fn imported_msccl_algorithms_run_correctly() {
    let mut files = Vec::new();
    for dir in [msccl_dir(), msccl_dir().join("prebuilt")] {
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
        let xml = std::fs::read_to_string(&file).unwrap();
        let ranks = attr(&xml, "ngpus");
        let chunks: u64 = attr(&xml, "nchunksperloop").parse().unwrap();
        let coll = attr(&xml, "coll");
        // One size a multiple of the chunk count (in floats), one not.
        let even = (chunks * 4 * 8).to_string();
        let odd = (chunks * 4 * 8 + 12).to_string();
        for size in [even, odd] {
            assert_correct(
                &[
                    "--plan",
                    file.to_str().unwrap(),
                    "-g",
                    &ranks,
                    "-c",
                    &coll,
                    "-b",
                    &size,
                    "-e",
                    &size,
                ],
                1,
            );
        }
    }
}

#[test]
fn under_mpirun_when_installed() {
    let Ok(probe) = Command::new("mpirun").arg("--version").output() else {
        eprintln!("skipped: mpirun is not installed (apt-get install openmpi-bin)");
        return;
    };
    assert!(probe.status.success());
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .arg(env!("CARGO_BIN_EXE_hccl-perf"))
        .args([
            "--backend",
            "process",
            "-c",
            "allreduce",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "32",
            "--check",
            "-n",
            "2",
            "-w",
            "1",
        ])
        .env("MASTER_PORT", "29517")
        .env("HCCL_TIMEOUT", "60")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("Out of bounds values : 0 OK"),
        "{}",
        text(&out)
    );
}

#[test]
fn bad_usage_exits_with_2() {
    for args in [
        &["-c", "gather"][..],
        &["-b", "1M", "-e", "1K"],
        &["-d", "float128"],
        &["-o", "xor"],
        &["--plan", "/nonexistent/plan.ron"],
        &["-g", "0"],
        &["--bogus-flag"],
    ] {
        let out = perf(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(!text(&out).contains("panicked"), "{}", text(&out));
    }
    let dir = std::env::temp_dir().join(format!("perf-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.plan.ron");
    std::fs::write(&garbage, b"\x00\x01not a plan").unwrap();
    let out = perf(&["--plan", garbage.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("garbage.plan.ron"), "{}", text(&out));
    // Bad configuration in the environment is bad input too, on both backends.
    for (var, value, backend) in [
        ("HCCL_NSOCKS", "0", "process"),
        ("HCCL_SOCKET_IFNAME", "^", "process"),
        ("HCCL_TIMEOUT", "soon", "threads"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_hccl-perf"))
            .args(["--backend", backend, "-g", "2", "-b", "8", "-e", "8"])
            .env_remove("HCCL_PLAN")
            .env(var, value)
            .output()
            .expect("hccl-perf runs");
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {}", text(&out));
        assert!(text(&out).contains(var), "{var}={value}: {}", text(&out));
    }
    let out = perf(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
}

/// `--algo` and `HCCL_ALGO` force a family: the `algorithm` column shows it for every size,
/// on both backends; an unknown family is bad input.
#[test]
fn forced_algorithm_is_what_runs_and_what_the_column_says() {
    for backend in ["threads", "process"] {
        for algo in ["ring", "oneshot"] {
            let out = perf(&[
                "--backend",
                backend,
                "-g",
                "2",
                "-b",
                "8",
                "-e",
                "64K",
                "-f",
                "64",
                "-n",
                "2",
                "-w",
                "0",
                "--algo",
                algo,
                "--check",
                "--json",
            ]);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{backend} {algo}: {}",
                text(&out)
            );
            for row in json(&out)["rows"].as_array().unwrap() {
                let shown = row["algorithm"].as_str().unwrap();
                assert!(shown.starts_with(&format!("{algo}/")), "{backend}: {row}");
                assert_eq!(row["wrong"], 0, "{backend}: {row}");
                assert!(
                    row["predicted_us"].as_f64().is_some_and(|p| p > 0.0),
                    "{row}"
                );
            }
        }
        let out = Command::new(env!("CARGO_BIN_EXE_hccl-perf"))
            .args([
                "--backend",
                backend,
                "-g",
                "2",
                "-e",
                "1K",
                "-n",
                "1",
                "-w",
                "0",
                "--json",
            ])
            .env("HCCL_ALGO", "mesh")
            .env_remove("HCCL_PLAN")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        for row in json(&out)["rows"].as_array().unwrap() {
            assert!(
                row["algorithm"].as_str().unwrap().starts_with("mesh/"),
                "{row}"
            );
        }
    }
    let out = perf(&["-g", "2", "-e", "1K", "--algo", "no_such_family"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no_such_family"), "{}", text(&out));
}

/// `--calibrate` measures, fits and writes a calibrated topology that compiles and runs.
#[test]
fn calibrate_writes_a_topology_that_plans_compile_for() {
    let dir = std::env::temp_dir().join(format!("hccl-perf-cal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let topo = dir.join("host2.ron");
    let out = perf(&[
        "--backend",
        "threads",
        "-g",
        "2",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "32",
        "-n",
        "3",
        "-w",
        "1",
        "--reps",
        "1",
        "--calibrate",
        topo.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc = json(&out);
    assert!(doc["rows"].as_array().unwrap().len() >= 6, "{doc}");
    assert!(doc["median_abs_error"].as_f64().unwrap().is_finite());
    let written = hccl::topologies::load(&topo).unwrap();
    assert!(written.spec.calibration.is_some());
    let out = perf(&[
        "-g",
        "2",
        "-e",
        "4K",
        "-n",
        "1",
        "-w",
        "0",
        "--topo",
        topo.to_str().unwrap(),
        "--check",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(json(&out)["plan"].as_str().unwrap().contains("calibrated"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--trace FILE`: the ranks (threads; processes on one host and on two emulated hosts, TCP
/// on loopback, clocks aligned by ping-pongs with rank 0) write measured timelines that are
/// merged into one trace-event file with a process per rank; bad trace settings are bad
/// input.
#[test]
fn trace_merges_the_ranks_of_a_process_job() {
    use hccl::ir::trace::{CALLS_TID, TraceFile};
    for (backend, hosts) in [("threads", "1"), ("process", "1"), ("process", "2")] {
        let file = std::env::temp_dir().join(format!(
            "perf-trace-{}-{backend}-{hosts}.json",
            std::process::id()
        ));
        let f = file.to_str().unwrap();
        let out = perf(&[
            "--backend",
            backend,
            "-g",
            "2",
            "--hosts",
            hosts,
            "-b",
            "64K",
            "-e",
            "64K",
            "-n",
            "1",
            "-w",
            "0",
            "--json",
            "--trace",
            f,
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        json(&out);
        let doc = TraceFile::load(&file).expect("a merged trace");
        assert_eq!(doc.check().expect("valid").processes, vec![0, 1]);
        for r in 0..2 {
            let mine = |cat: &str| {
                doc.events
                    .iter()
                    .filter(|e| e.pid == r && e.cat.as_deref() == Some(cat))
                    .count()
            };
            assert!(mine("step") > 0 && mine("call") > 0, "rank {r}");
            assert!(doc.events.iter().any(|e| e.pid == r
                && e.tid == Some(CALLS_TID)
                && e.args.get("bytes") == Some(&serde_json::json!(65536))));
        }
        let ranks = doc.other["ranks"].as_array().expect("rank data");
        let clock = &ranks[1]["clock"];
        let ran = ranks[1]["backend"].as_str().unwrap_or_default();
        assert!(ran.starts_with(backend), "{ran}");
        if hosts == "2" {
            assert!(
                clock["method"].as_str().unwrap().contains("ping-pong"),
                "{clock}"
            );
            assert!(clock["uncertainty_us"].as_f64().unwrap() > 0.0, "{clock}");
        } else {
            assert_eq!(clock["offset_us"], 0.0, "{clock}");
        }
        let _ = std::fs::remove_file(&file);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_hccl-perf"))
        .args([
            "-g",
            "2",
            "-b",
            "8",
            "-e",
            "8",
            "--trace",
            "/tmp/never.json",
        ])
        .env("HCCL_TRACE_CALLS", "0")
        .output()
        .expect("hccl-perf runs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("HCCL_TRACE_CALLS"), "{}", text(&out));
    let out = perf(&[
        "--calibrate",
        "/tmp/never.ron",
        "--trace",
        "/tmp/never.json",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// `--plot`: the sweep as an SVG chart, measured bus bandwidth beside the plan's prediction,
/// a marker per size; with processes rank 0 draws it.
#[test]
fn plot_draws_measured_against_predicted() {
    let dir = std::env::temp_dir().join(format!("perf-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for backend in ["threads", "process"] {
        let svg = dir.join(format!("{backend}.svg"));
        let out = perf(&[
            "--backend",
            backend,
            "-g",
            "2",
            "-b",
            "1K",
            "-e",
            "16K",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "--json",
            "--plot",
            svg.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{backend}: {}", text(&out));
        let doc = json(&out);
        let rows = doc["rows"].as_array().unwrap().len();
        assert_eq!(rows, 3);
        // What ran is written on the measured line (at the first size at least).
        let first = doc["rows"][0]["algorithm"].as_str().unwrap().to_string();
        let body = std::fs::read_to_string(&svg).expect("SVG written");
        let doc = roxmltree::Document::parse(&body).expect("the SVG is XML");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(str::trim)
            .collect();
        for want in [
            "measured",
            "predicted (the plan's cost model)",
            "bus bandwidth (GB/s, log scale)",
            "message size (bytes, log scale)",
            "1K",
            "16K",
            first.as_str(),
        ] {
            assert!(texts.contains(&want), "{backend}: {want} not in {texts:?}");
        }
        assert!(
            texts.iter().any(|t| t.starts_with("allreduce, 2 ranks")),
            "{texts:?}"
        );
        // One marker per measured size (the measured series' colour).
        let markers = doc
            .descendants()
            .filter(|n| n.has_tag_name("circle") && n.attribute("fill") == Some("#1F77B4"))
            .count();
        assert_eq!(markers, rows, "{backend}");
    }
    // With --calibrate there is no sweep to draw.
    let out = perf(&["--plot", "x.svg", "--calibrate", "y.ron"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// At a communicator's start (here `hccl-perf`'s), an unknown `HCCL_*` name is a warning on
/// stderr naming the closest known one, without `HCCL_DEBUG`; a misspelt value of an
/// enumerated variable, or an `HCCL_ALGO` no entry of the plan has, is bad input naming the
/// variable, the value and what is accepted.
#[test]
fn misspelt_variables_are_warned_and_misspelt_values_refused() {
    let plan = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pair_allreduce.plan.ron");
    let plan = plan.to_str().unwrap();
    let run = |vars: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hccl-perf"));
        cmd.args(["-g", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"])
            .args(["--plan", plan])
            .env_remove("HCCL_PLAN")
            .env_remove("HCCL_DEBUG")
            .env("HCCL_TIMEOUT", "60");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.output().expect("hccl-perf runs")
    };
    // Built, not written as literals: `env_table` counts a whole literal as a name read.
    let out = run(&[
        (concat!("HCCL_", "ALGOO"), "direct"),
        (concat!("HCCL_", "TIMOUT"), "5"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains(
            "HCCL_ALGOO is set but is not a variable hccl reads (did you mean HCCL_ALGO?)"
        ),
        "{err}"
    );
    assert!(err.contains("did you mean HCCL_TIMEOUT?"), "{err}");
    assert_eq!(
        err.matches(concat!("HCCL_", "ALGOO")).count(),
        1,
        "warned once: {err}"
    );
    for (var, value, accepted) in [
        ("HCCL_ALGO", "drect", "direct"),
        ("HCCL_PROTO", "Simpel", "LL128"),
        ("HCCL_DEBUG", "INOF", "info"),
    ] {
        let out = run(&[(var, value)]);
        assert_eq!(out.status.code(), Some(2), "{var}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.contains(&format!("{var}={value}: expected")), "{err}");
        assert!(err.contains(accepted), "{err}");
    }
}

/// Settings no backend would honour are refused, saying what to do, instead of being
/// ignored: `--hosts` on the threads backend, `--calibrate` and `--hosts` under a launcher.
#[test]
fn settings_that_would_be_ignored_are_refused() {
    let out = perf(&["-g", "2", "--hosts", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("hccl-perf: --hosts 2 needs --backend process"),
        "{}",
        text(&out)
    );
    let launched = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hccl-perf"))
            .args(args)
            .env_remove("HCCL_PLAN")
            .env_remove("HCCL_PERF_PLAN_LABEL")
            .env("RANK", "0")
            .env("WORLD_SIZE", "2")
            .output()
            .expect("hccl-perf runs")
    };
    let out = launched(&["--backend", "process", "--calibrate", "x.ron"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--calibrate under a launcher (RANK=0 is set)")
            && text(&out).contains("--topo OUT.ron"),
        "{}",
        text(&out)
    );
    let out = launched(&["--backend", "process", "--hosts", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--hosts 2 under a launcher (RANK=0 is set)")
            && text(&out).contains("HCCL_HOST_ID"),
        "{}",
        text(&out)
    );
}

/// The predictions of a plan compiled for this machine say that they use the built-in
/// calibration of the development machine, and how to calibrate this one.
#[test]
fn predictions_name_their_calibration() {
    let args = ["-g", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0"];
    let out = perf(&[&args[..], &["--json"][..]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let cal = &json(&out)["calibration"];
    assert_eq!(cal["kind"], "built-in", "{cal}");
    assert!(
        cal["source"]
            .as_str()
            .is_some_and(|s| s.contains("development VM")),
        "{cal}"
    );
    assert!(
        cal["how_to_calibrate"]
            .as_str()
            .is_some_and(|s| s.contains("hccl-perf --calibrate OUT.ron")),
        "{cal}"
    );
    let out = perf(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("# calibration: the built-in default, not measured on this machine"),
        "{}",
        text(&out)
    );
}

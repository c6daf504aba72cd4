//! `hcclc cache show|clear`: what the synthesis and plan caches hold on disk
//! (`$HCCL_CACHE_DIR`, else `$XDG_CACHE_HOME/hccl`, else `~/.cache/hccl`), and emptying them.

use crate::cli_error::{CliError, print_json};
use clap::{Args, Subcommand};
use hccl_compiler::synth::cache::{self, AreaUsage};

/// The compiler's caches on disk (`hcclc compile` reads and writes them unless `--no-cache`).
#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Where the caches are, and per area (synth: solver results; plans: whole compiles)
    /// its entries and bytes.
    Show(ShowArgs),
    /// Remove the entries of both areas, or of one (`--area`). Always safe: a compile that
    /// finds no entry searches (and solves) again.
    Clear(ClearArgs),
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ClearArgs {
    /// Only this area: synth or plans.
    #[arg(long, value_name = "synth|plans")]
    pub area: Option<String>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: CacheCommand) -> Result<(), CliError> {
    let dir = cache::default_dir().ok_or_else(|| {
        CliError::Input(
            "no cache directory: set HCCL_CACHE_DIR (or XDG_CACHE_HOME, or HOME)".into(),
        )
    })?;
    match cmd {
        CacheCommand::Show(args) => {
            let used = cache::usage(&dir);
            print_usage(&dir, "", &used, args.json);
        }
        CacheCommand::Clear(args) => {
            let areas: Vec<&str> = match args.area.as_deref() {
                None => cache::AREAS.to_vec(),
                Some(a) if cache::AREAS.contains(&a) => vec![a],
                Some(a) => {
                    return Err(CliError::Input(format!(
                        "--area {a}: expected one of {}",
                        cache::AREAS.join(", ")
                    )));
                }
            };
            let mut removed = Vec::new();
            for area in areas {
                removed.push(cache::clear(&dir, area).map_err(|e| {
                    CliError::Input(format!("{}: cannot clear: {e}", dir.join(area).display()))
                })?);
            }
            print_usage(&dir, "removed ", &removed, args.json);
        }
    }
    Ok(())
}

fn print_usage(dir: &std::path::Path, verb: &str, areas: &[AreaUsage], json: bool) {
    if json {
        let key = if verb.is_empty() { "areas" } else { "removed" };
        print_json(&serde_json::json!({
            "dir": dir.display().to_string(),
            key: areas,
        }));
        return;
    }
    println!("cache {}", dir.display());
    for a in areas {
        println!(
            "  {:<6} {verb}{}, {}",
            a.area,
            crate::plan_cmd::entries_text(a.entries),
            human(a.bytes)
        );
    }
}

/// `812 B`, `10.2 KiB`, `17.5 MiB`, `1.0 GiB`.
fn human(bytes: u64) -> String {
    let units = [("GiB", 30), ("MiB", 20), ("KiB", 10)];
    match units.iter().find(|(_, shift)| bytes >= 1 << shift) {
        Some((unit, shift)) => format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64),
        None => format!("{bytes} B"),
    }
}

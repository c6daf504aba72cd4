//! `hcclc import` and `hcclc export`: MSCCL XML interop.

use crate::cli_error::{CliError, print_json};
use clap::{Args, ValueEnum};
use hccl_ir::PlanFile;
use hccl_ir::msccl::{export_xml, load_xml};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// MSCCL algorithm file (XML).
    pub xml: PathBuf,
    /// Plan file to write (default: the XML's stem with `.plan.ron`).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ExportFormat {
    /// MSCCL's XML algorithm format.
    MscclXml,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Plan file (RON).
    pub plan: PathBuf,
    /// Target format.
    #[arg(long = "to", value_enum)]
    pub format: ExportFormat,
    /// Output file; with several entries, `-N` is inserted before the extension. Default: stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Export only entry N (as listed by `hcclc show`).
    #[arg(long)]
    pub entry: Option<usize>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Errors printed before the rest are summarised as a count.
const MAX_ERRORS: usize = 20;

fn default_plan_path(xml: &Path) -> PathBuf {
    let stem = xml
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "algorithm".to_string());
    PathBuf::from(format!("{stem}.plan.ron"))
}

/// `hcclc import`: XML → verified plan file. A file that does not verify is not written.
pub fn import(args: ImportArgs) -> Result<(), CliError> {
    let imported = load_xml(&args.xml).map_err(CliError::input)?;
    let origin = args.xml.display().to_string();
    let warnings = imported.warnings.clone();
    let plan = imported.into_plan(&origin);
    if let Err(failures) = hccl_ir::verify::verify_plan(&plan) {
        let mut msg = format!("{origin}: the algorithm does not implement its collective");
        let all: Vec<String> = failures
            .iter()
            .flat_map(|(entry, errors)| {
                errors
                    .iter()
                    .map(move |err| format!("entry {entry}: {err}"))
            })
            .collect();
        for line in all.iter().take(MAX_ERRORS) {
            msg.push_str(&format!("\n  {line}"));
        }
        if all.len() > MAX_ERRORS {
            msg.push_str(&format!("\n  … and {} more", all.len() - MAX_ERRORS));
        }
        return Err(CliError::Failed(msg));
    }
    let out = args.output.unwrap_or_else(|| default_plan_path(&args.xml));
    plan.save(&out).map_err(CliError::input)?;
    if args.json {
        print_json(&serde_json::json!({
            "plan": out.display().to_string(),
            "entries": plan.entries.len(),
            "warnings": warnings,
        }));
    } else {
        for w in &warnings {
            eprintln!("hcclc: warning: {origin}: {w}");
        }
        println!(
            "imported {origin} → {} ({} entr{}, verified)",
            out.display(),
            plan.entries.len(),
            if plan.entries.len() == 1 { "y" } else { "ies" }
        );
    }
    Ok(())
}

fn numbered(path: &Path, index: usize, total: usize) -> PathBuf {
    if total == 1 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{stem}-{index}{ext}"))
}

/// `hcclc export`: plan file → MSCCL XML, one file per entry.
pub fn export(args: ExportArgs) -> Result<(), CliError> {
    let ExportFormat::MscclXml = args.format;
    let plan = PlanFile::load(&args.plan).map_err(CliError::input)?;
    let selected: Vec<usize> = match args.entry {
        Some(i) if i < plan.entries.len() => vec![i],
        Some(i) => {
            return Err(CliError::Input(format!(
                "{}: no entry {i} (the plan has {})",
                args.plan.display(),
                plan.entries.len()
            )));
        }
        None => (0..plan.entries.len()).collect(),
    };
    if selected.is_empty() {
        return Err(CliError::Input(format!(
            "{}: the plan has no entries",
            args.plan.display()
        )));
    }
    if args.output.is_none() && selected.len() > 1 {
        return Err(CliError::Input(format!(
            "{}: {} entries; choose one with --entry N or give -o FILE (one file per entry)",
            args.plan.display(),
            selected.len()
        )));
    }
    let mut written = Vec::new();
    for (k, &i) in selected.iter().enumerate() {
        let exported = export_xml(&plan.entries[i])
            .map_err(|e| CliError::Failed(format!("{}: entry {i}: {e}", args.plan.display())))?;
        for w in &exported.warnings {
            eprintln!("hcclc: warning: entry {i}: {w}");
        }
        match &args.output {
            Some(out) => {
                let path = numbered(out, k, selected.len());
                hccl_ir::write_atomic(&path, exported.xml.as_bytes()).map_err(|e| {
                    CliError::Input(format!("{}: cannot write: {e}", path.display()))
                })?;
                written.push(path.display().to_string());
            }
            None if args.json => written.push(exported.xml),
            None => print!("{}", exported.xml),
        }
    }
    if args.json {
        let key = if args.output.is_some() {
            "files"
        } else {
            "xml"
        };
        print_json(&serde_json::json!({ key: written }));
    } else if args.output.is_some() {
        for path in &written {
            eprintln!("wrote {path}");
        }
    }
    Ok(())
}

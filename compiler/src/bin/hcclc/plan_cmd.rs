//! `hcclc verify` and `hcclc show`.

use crate::cli_error::CliError;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Plan file (RON).
    pub plan: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Plan file (RON).
    pub plan: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn verify(args: VerifyArgs) -> Result<(), CliError> {
    let plan = hccl_ir::PlanFile::load(&args.plan).map_err(CliError::input)?;
    let _ = (plan, args.json);
    Ok(())
}

pub fn show(args: ShowArgs) -> Result<(), CliError> {
    let plan = hccl_ir::PlanFile::load(&args.plan).map_err(CliError::input)?;
    let _ = (plan, args.json);
    Ok(())
}

//! `hcclc topo show|gen`.

use crate::cli_error::CliError;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum TopoCommand {
    /// Summarise a topology: devices, links, bandwidth matrix, bisection and injection bandwidth.
    Show(ShowArgs),
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Topology file (RON).
    pub file: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: TopoCommand) -> Result<(), CliError> {
    match cmd {
        TopoCommand::Show(args) => Err(CliError::Input(format!(
            "{}: topology support is being built",
            args.file.display()
        ))),
    }
}

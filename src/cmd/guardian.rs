//! `gpushare guardian`: started by `gpushare node`; thaws the cgroups in the controller's list
//! the moment the agent dies (its pipe closes), SIGKILL included.

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct GuardianArgs {
    /// The controller's list of cgroups it may have frozen.
    #[arg(long)]
    pub list: PathBuf,
}

pub fn run(args: &GuardianArgs) -> anyhow::Result<()> {
    Ok(crate::throttle::guardian::run(&args.list)?)
}

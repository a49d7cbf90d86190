//! `gpushare guardian`: started by `gpushare node`; thaws the cgroups in the controller's list
//! the moment the agent dies (its pipe closes), SIGKILL included.

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct GuardianArgs {
    /// The controller's list of cgroups it may have frozen.
    #[arg(long)]
    pub list: PathBuf,
    /// Thaw what the list names now and exit (systemd's `ExecStopPost`, or by hand).
    #[arg(long)]
    pub now: bool,
    /// Leave the agent's cgroups first, for the root of each hierarchy under this cgroupfs
    /// (the agent passes its `throttle.cgroup_root`): a kill of the agent's whole container
    /// then spares the guardian.
    #[arg(long)]
    pub leave_cgroup: Option<PathBuf>,
}

pub fn run(args: &GuardianArgs) -> anyhow::Result<()> {
    if args.now {
        let n = crate::throttle::guardian::thaw_listed(&args.list);
        eprintln!(
            "gpushare guardian: thawed {n} cgroup(s) from {}",
            args.list.display()
        );
        return Ok(());
    }
    Ok(crate::throttle::guardian::run(
        &args.list,
        args.leave_cgroup.as_deref(),
    )?)
}

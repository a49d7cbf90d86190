//! `gpushare guardian`: thaws the cgroups in the controller's list the moment the agent dies,
//! SIGKILL included: started by `gpushare node` (its pipe closes), or in a container of its
//! own beside the agent (`--watch`: the agent's state-directory lock is let go).

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct GuardianArgs {
    /// The controller's list of cgroups it may have frozen.
    #[arg(long, required_unless_present = "watch")]
    pub list: Option<PathBuf>,
    /// Thaw what the list names now and exit (systemd's `ExecStopPost`, or by hand).
    #[arg(long, requires = "list")]
    pub now: bool,
    /// Run beside the agent instead of under it: each time no agent holds this state
    /// directory's lock (`agent.lock`), thaw its `guardian.list`; until a termination signal
    /// after the agent has gone (the chart's `guardian` container).
    #[arg(long, conflicts_with_all = ["list", "leave_cgroup"])]
    pub watch: Option<PathBuf>,
    /// Leave the agent's cgroups first, for the root of each hierarchy under this cgroupfs
    /// (the agent passes its `throttle.cgroup_root`): a kill of the agent's whole container
    /// then spares the guardian.
    #[arg(long)]
    pub leave_cgroup: Option<PathBuf>,
}

pub fn run(args: &GuardianArgs) -> anyhow::Result<()> {
    let list = match (&args.watch, &args.list) {
        (Some(dir), _) => return Ok(crate::throttle::guardian::watch(dir)?),
        (None, Some(list)) => list,
        (None, None) => anyhow::bail!("gpushare guardian: --list or --watch is required"),
    };
    if args.now {
        let n = crate::throttle::guardian::thaw_listed(list);
        eprintln!(
            "gpushare guardian: thawed {n} cgroup(s) from {}",
            list.display()
        );
        return Ok(());
    }
    Ok(crate::throttle::guardian::run(
        list,
        args.leave_cgroup.as_deref(),
    )?)
}

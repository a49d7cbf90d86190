//! `gpushare-runtime`: the OCI runtime wrapper on its own (containerd's runc `BinaryName`,
//! podman's `--runtime`), every argument runc's. The same code as `gpushare runtime`, in a
//! binary that holds only the wrapper, the bundle and the agent's client: the runtime's shim
//! runs it twice per container start, so its exec cost is on every start's path.

fn main() {
    std::process::exit(gpushare::runtime::wrapper::run(
        std::env::args_os().skip(1).collect(),
    ));
}

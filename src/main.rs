//! `gpushare`: the binary; the subcommands live in `gpushare::cmd`.

fn main() -> anyhow::Result<()> {
    gpushare::cmd::main()
}

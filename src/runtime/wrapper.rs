//! `gpushare runtime`: an OCI runtime wrapper (containerd's runc `BinaryName`, podman's
//! `--runtime`). `create` asks the node agent for its decision on the bundle's spec, writes
//! the adjustment into `config.json` and runs the real runtime, unregistering the container
//! if that fails; `start` tells the agent without waiting, `delete` briefly (both best
//! effort); every other verb, and every argument, goes to the real runtime unchanged.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::api::{self, Request};
use super::client::{self, ClientConfig, Prepared};
use super::oci::{self, BundleSpec};

/// What the wrapper needs of a runc command line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Invocation {
    /// The subcommand (`create`, `start`, `delete`, …); empty when there is none.
    pub verb: String,
    /// `--bundle`/`-b` of `create`/`run` (default: the working directory).
    pub bundle: Option<PathBuf>,
    /// The container id: the last argument of the verbs that take one.
    pub id: Option<String>,
    /// The global `--log` file, where runc's callers (containerd's shim) read its errors.
    pub log: Option<PathBuf>,
    pub log_json: bool,
}

/// runc's global options that take a value.
const GLOBAL_WITH_VALUE: &[&str] = &["--root", "--log", "--log-format", "--criu", "--rootless"];
/// Options of `create`/`run` that take a value.
const CREATE_WITH_VALUE: &[&str] = &[
    "--bundle",
    "-b",
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
];

impl Invocation {
    pub fn parse(args: &[OsString]) -> Invocation {
        let mut inv = Invocation::default();
        let s = |a: &OsString| a.to_string_lossy().into_owned();
        let mut i = 0;
        while i < args.len() {
            let a = s(&args[i]);
            if let Some((flag, value)) = a.split_once('=').filter(|_| a.starts_with("--")) {
                inv.global(flag, value);
            } else if GLOBAL_WITH_VALUE.contains(&a.as_str()) {
                if let Some(v) = args.get(i + 1) {
                    inv.global(&a, &s(v));
                }
                i += 1;
            } else if !a.starts_with('-') {
                inv.verb = a;
                break;
            }
            i += 1;
        }
        let rest = &args[(i + 1).min(args.len())..];
        let mut j = 0;
        let mut positional = Vec::new();
        while j < rest.len() {
            let a = s(&rest[j]);
            if let Some((flag, value)) = a.split_once('=').filter(|_| a.starts_with('-')) {
                if flag == "--bundle" || flag == "-b" {
                    inv.bundle = Some(PathBuf::from(value));
                }
            } else if CREATE_WITH_VALUE.contains(&a.as_str())
                && matches!(inv.verb.as_str(), "create" | "run")
            {
                if (a == "--bundle" || a == "-b")
                    && let Some(v) = rest.get(j + 1)
                {
                    inv.bundle = Some(PathBuf::from(v));
                }
                j += 1;
            } else if !a.starts_with('-') {
                positional.push(a);
            }
            j += 1;
        }
        inv.id = positional.pop();
        inv
    }

    fn global(&mut self, flag: &str, value: &str) {
        match flag {
            "--log" => self.log = Some(PathBuf::from(value)),
            "--log-format" => self.log_json = value == "json",
            _ => {}
        }
    }
}

/// The longest a `start` or `delete` waits for the agent.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs the wrapper; returns the exit code (when it does not become the real runtime).
pub fn run(args: Vec<OsString>) -> i32 {
    let inv = Invocation::parse(&args);
    let cfg = match ClientConfig::load() {
        Ok(c) => c,
        Err(e) => return fail(&inv, &format!("gpushare runtime: {e}")),
    };
    let runtime = match resolve(&cfg.runtime) {
        Ok(p) => p,
        Err(e) => return fail(&inv, &format!("gpushare runtime: {e}")),
    };
    let notify = NOTIFY_TIMEOUT.min(Duration::from_millis(cfg.timeout_ms));
    match (inv.verb.as_str(), inv.id.clone()) {
        ("create" | "run", Some(id)) => {
            let bundle = inv.bundle.clone().unwrap_or_else(|| PathBuf::from("."));
            let admitted = match prepare(&cfg, &id, &bundle) {
                Ok(admitted) => admitted,
                Err(msg) => return fail(&inv, &msg),
            };
            if inv.verb == "run" || !admitted {
                return exec(&runtime, &args);
            }
            // create: the container is on the agent's books; if runc fails it must not be.
            let code = match std::process::Command::new(&runtime).args(&args).status() {
                Ok(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)),
                Err(e) => {
                    eprintln!("gpushare runtime: cannot run {}: {e}", runtime.display());
                    127
                }
            };
            if code != 0 {
                let _ = cfg.call(&Request::Remove { id });
            }
            code
        }
        ("start", Some(id)) => {
            // Best effort (the registry's state; the controller tracks a created container
            // already) and sent without waiting for the agent: a start is on the pod's
            // critical path, and runc need not wait for the registry.
            let _ = api::notify(&cfg.socket, &Request::Start { id }, notify);
            exec(&runtime, &args)
        }
        ("delete", Some(id)) => {
            // Best effort, likewise: a container that is gone is released by the next resync
            // too.
            let _ = api::call(&cfg.socket, &Request::Remove { id }, notify);
            exec(&runtime, &args)
        }
        _ => exec(&runtime, &args),
    }
}

/// The decision on a container being created, written into its bundle. `Ok(true)`: a GPU
/// container the agent admitted (and registered under `id`); `Ok(false)`: not a GPU
/// container (its environment neutralized if it would select GPUs), or one the precreate
/// hook already decided on (registered under its handle). `Err`: the message to fail with.
fn prepare(cfg: &ClientConfig, id: &str, bundle: &Path) -> Result<bool, String> {
    let mut b = BundleSpec::load(bundle).map_err(|e| format!("gpushare: {e}"))?;
    // Both modes configured (podman's hooks.d and `--runtime gpushare-runtime`): the hook's
    // decision is in the spec already; a second one would count the container twice. (Only
    // the hook writes the annotation: containerd's CRI passes a pod's annotations to the spec
    // only as configured — the shipped config names the assignment and the grants.)
    if oci::handle(&b).is_some() {
        return Ok(false);
    }
    let prepared = client::prepare(cfg, id, &mut b)?;
    let admitted = prepared == Prepared::Admitted;
    if prepared != (Prepared::NotGpu { neutralized: false })
        && let Err(e) = b.save()
    {
        if admitted {
            let _ = cfg.call(&Request::Remove { id: id.into() });
        }
        return Err(format!("gpushare: {e}"));
    }
    Ok(admitted)
}

/// The real runtime's path: `runtime` itself if it has a `/`, else the first on `PATH`;
/// never this binary (a wrapper configured as its own runtime would loop).
fn resolve(runtime: &Path) -> Result<PathBuf, String> {
    let found = if runtime.components().count() > 1 {
        Some(runtime.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(runtime))
                .find(|p| p.is_file())
        })
    };
    let found = found.ok_or_else(|| format!("runtime {} not found on PATH", runtime.display()))?;
    let me = std::env::current_exe()
        .ok()
        .and_then(|p| p.canonicalize().ok());
    if me.is_some() && found.canonicalize().ok() == me {
        return Err(format!(
            "runtime {} is gpushare itself; set runtime to the real OCI runtime (runc)",
            found.display()
        ));
    }
    Ok(found)
}

fn exec(runtime: &Path, args: &[OsString]) -> i32 {
    let e = std::process::Command::new(runtime).args(args).exec();
    eprintln!("gpushare runtime: cannot run {}: {e}", runtime.display());
    127
}

/// Fails the command with `msg`: on stderr, and in runc's `--log` file in its format — the
/// containerd shim reports the last error found there.
fn fail(inv: &Invocation, msg: &str) -> i32 {
    eprintln!("{msg}");
    if let Some(log) = &inv.log {
        let line = if inv.log_json {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let time = gpushare_core::rfc3339::format_unix(secs);
            serde_json::json!({"level": "error", "msg": msg, "time": time}).to_string()
        } else {
            format!("level=error msg={msg:?}")
        };
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{line}");
        }
    }
    1
}

/// Whether this process was started as `gpushare-runtime` (a link to the binary, for
/// runtimes that take a binary path without arguments).
pub fn invoked_as_wrapper(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|n| n == "gpushare-runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_the_shims_create() {
        let inv = Invocation::parse(&args(&[
            "--root",
            "/run/containerd/runc/k8s.io",
            "--log",
            "/b/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/b",
            "--pid-file",
            "/b/init.pid",
            "--console-socket=/tmp/c.sock",
            "c1",
        ]));
        assert_eq!(inv.verb, "create");
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
        assert_eq!(inv.id.as_deref(), Some("c1"));
        assert_eq!(inv.log, Some(PathBuf::from("/b/log.json")));
        assert!(inv.log_json);
    }

    #[test]
    fn parses_other_verbs() {
        let inv = Invocation::parse(&args(&["--root=/r", "delete", "--force", "c2"]));
        assert_eq!(
            (inv.verb.as_str(), inv.id.as_deref()),
            ("delete", Some("c2"))
        );
        assert_eq!(inv.bundle, None);
        let inv = Invocation::parse(&args(&["run", "-b", "/x", "-d", "c3"]));
        assert_eq!(inv.bundle, Some(PathBuf::from("/x")));
        assert_eq!(inv.id.as_deref(), Some("c3"));
        let inv = Invocation::parse(&args(&["--version"]));
        assert_eq!((inv.verb.as_str(), inv.id), ("", None));
        let inv = Invocation::parse(&args(&["kill", "c4", "KILL"]));
        assert_eq!(
            inv.id.as_deref(),
            Some("KILL"),
            "the last argument; only create, start and delete use it"
        );
    }

    #[test]
    fn the_wrapper_name() {
        assert!(invoked_as_wrapper(OsStr::new(
            "/usr/local/bin/gpushare-runtime"
        )));
        assert!(!invoked_as_wrapper(OsStr::new("gpushare")));
    }
}

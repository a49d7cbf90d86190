//! `gpushare hook <stage>`: OCI hooks in the hooks.d format (podman; `install/hooks.d/`), for
//! runtimes without NRI where no runtime wrapper is configured.
//!
//! - `precreate` — podman's extension stage (containers/common `RuntimeConfigFilter`): the
//!   proposed spec on stdin, the spec to create the container with on stdout; a non-zero
//!   exit fails the container's start. The container has no id yet at this stage, so the
//!   hook names a GPU container with a new handle, written into its spec as the
//!   `gpushare.io/handle` annotation: the agent's books, its limiter files and every later
//!   call are keyed on it, and so is the registry rebuilt from runc's state (a handle that
//!   never reaches runc is released by the agent: `pending`). The decision is the wrapper's
//!   (`client::prepare`): same refusals, same messages, fail closed.
//! - `poststart` — OCI, run by the runtime once the process started (the state on stdin,
//!   with the spec's annotations): the container is running. A failing poststart hook gets
//!   the container killed, so this one never fails.
//! - `poststop` — run by podman once the runtime deleted the container (the state on stdin:
//!   the annotations podman was given, not the hook's, and the bundle whose `config.json`
//!   holds the handle): the container is gone. Never fails its caller either.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::api::Request;
use super::client::{self, ClientConfig};
use super::oci::{self, BundleSpec, HANDLE_ANNOTATION, MAX_SPEC_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// The proposed spec on stdin; the spec with the agent's decision on stdout.
    Precreate,
    /// The state on stdin: the container started.
    Poststart,
    /// The state on stdin: the container is gone.
    Poststop,
}

/// Runs the hook for `stage` on this process's stdin and stdout; returns the exit code.
pub fn run(stage: Stage) -> i32 {
    let mut input = Vec::new();
    let cfg = std::io::stdin()
        .take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut input)
        .map_err(|e| format!("cannot read stdin: {e}"))
        .and(ClientConfig::load());
    match stage {
        Stage::Precreate => match cfg
            .map_err(|e| format!("gpushare hook precreate: {e}"))
            .and_then(|cfg| precreate_to_stdout(&cfg, &input))
        {
            Ok(()) => 0,
            Err(msg) => {
                tell_the_caller(&msg);
                1
            }
        },
        Stage::Poststart | Stage::Poststop => {
            if let Err(e) = cfg.and_then(|cfg| notify(&cfg, stage, &input)) {
                let name = if stage == Stage::Poststart {
                    "poststart"
                } else {
                    "poststop"
                };
                eprintln!("gpushare hook {name}: {e}");
            }
            0
        }
    }
}

/// `precreate` with a new handle, the spec written to stdout (and the container taken off
/// the agent's books again if it cannot be).
fn precreate_to_stdout(cfg: &ClientConfig, input: &[u8]) -> Result<(), String> {
    let handle = new_handle()?;
    let (json, admitted) = precreate(cfg, input, &handle)?;
    let mut stdout = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut stdout, &json)
        .map_err(std::io::Error::from)
        .and_then(|_| stdout.flush());
    if let Err(e) = written {
        if admitted {
            let _ = cfg.call(&Request::Remove { id: handle });
        }
        return Err(format!(
            "gpushare hook precreate: cannot write the spec: {e}"
        ));
    }
    Ok(())
}

/// The precreate decision on `input`, a proposed spec: the spec to create the container with,
/// and whether the agent admitted it (under `handle`, which a GPU container's spec carries).
pub fn precreate(cfg: &ClientConfig, input: &[u8], handle: &str) -> Result<(Value, bool), String> {
    if input.len() as u64 > MAX_SPEC_BYTES {
        return Err(format!(
            "gpushare hook precreate: the spec on stdin is larger than {MAX_SPEC_BYTES} bytes"
        ));
    }
    let mut b = BundleSpec::parse(PathBuf::from("the spec on stdin"), input)
        .map_err(|e| format!("gpushare: {e}"))?;
    // A handle already there is the caller's, not ours (podman builds each spec afresh):
    // replaced, so that no two containers share one.
    if oci::has_gpu_hint(&b) && !b.is_sandbox() {
        let annotations = b
            .json
            .as_object_mut()
            .expect("a parsed spec is an object")
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        let Some(annotations) = annotations.as_object_mut() else {
            return Err("gpushare: the spec's annotations are not an object".into());
        };
        annotations.insert(HANDLE_ANNOTATION.into(), Value::String(handle.into()));
    }
    let prepared = client::prepare(cfg, handle, &mut b)?;
    Ok((b.json, prepared == client::Prepared::Admitted))
}

/// A new handle: `hook-` and 128 random bits in hex (a valid runc id).
fn new_handle() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("gpushare hook precreate: cannot read /dev/urandom: {e}"))?;
    Ok(handle_from(bytes))
}

fn handle_from(bytes: [u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("hook-{hex}")
}

/// The OCI state a runtime hands a hook (what these hooks read of it).
#[derive(Debug, Clone, Deserialize)]
pub struct State {
    pub id: String,
    #[serde(default)]
    pub bundle: Option<PathBuf>,
    #[serde(default)]
    pub annotations: Option<HashMap<String, String>>,
}

/// The handle the container was admitted under: in the state's annotations (the runtime's
/// state: the spec's), else in its bundle's `config.json` (podman's poststop state carries the
/// annotations it was given, not the hook's). `None`: the container was never admitted.
pub fn handle_of(state: &State) -> Result<Option<String>, String> {
    if let Some(h) = state
        .annotations
        .as_ref()
        .and_then(|a| a.get(HANDLE_ANNOTATION))
    {
        return Ok(Some(h.clone()));
    }
    match &state.bundle {
        Some(dir) if !dir.as_os_str().is_empty() => match BundleSpec::load(dir) {
            Ok(b) => Ok(oci::handle(&b)),
            Err(e) => Err(format!("container {}: {e}", state.id)),
        },
        _ => Ok(None),
    }
}

/// `poststart`/`poststop`: tells the agent about the container the state on `input` names.
fn notify(cfg: &ClientConfig, stage: Stage, input: &[u8]) -> Result<(), String> {
    let state: State =
        serde_json::from_slice(input).map_err(|e| format!("the state on stdin: {e}"))?;
    let Some(id) = handle_of(&state)? else {
        return Ok(());
    };
    let req = match stage {
        Stage::Poststart => Request::Start { id: id.clone() },
        _ => Request::Remove { id: id.clone() },
    };
    let resp = cfg
        .call(&req)
        .map_err(|e| format!("container {} (handle {id}): {e}", state.id))?;
    if !resp.ok {
        return Err(format!(
            "container {} (handle {id}): {}",
            state.id, resp.message
        ));
    }
    Ok(())
}

/// Says why the container is refused: on stderr, and on the stderr of the process that ran
/// the hook when that is another file. podman runs precreate hooks with their stderr on
/// /dev/null and reports only "exit status 1"; its own stderr is where its user reads.
fn tell_the_caller(msg: &str) {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    eprintln!("{msg}");
    let theirs = PathBuf::from(format!(
        "/proc/{}/fd/2",
        std::os::unix::process::parent_id()
    ));
    let Ok(them) = std::fs::metadata(&theirs) else {
        return;
    };
    let same = std::fs::metadata("/proc/self/fd/2")
        .is_ok_and(|us| (us.dev(), us.ino()) == (them.dev(), them.ino()));
    if same {
        return;
    }
    // Appended (a log file keeps what it has), never blocking on a full pipe.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&theirs)
    {
        let _ = writeln!(f, "{msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::BufRead;
    use std::os::unix::net::UnixListener;
    use std::path::Path;

    fn spec(annotations: Value, env: &[&str]) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "ociVersion": "1.0.2-dev",
            "process": {"cwd": "/", "user": {"uid": 0, "gid": 0}, "args": ["sh"], "env": env},
            "root": {"path": "/var/lib/containers/storage/overlay/x/merged"},
            "annotations": annotations,
            "linux": {"cgroupsPath": "/libpod_parent/libpod-0123"},
            "someFieldPodmanAdds": 1,
        }))
        .unwrap()
    }

    /// An agent that answers one request with `answer` and hands back what it was asked.
    fn agent(dir: &Path, answer: Value) -> (ClientConfig, std::thread::JoinHandle<Value>) {
        let socket = dir.join("runtime.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let served = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut line = String::new();
            std::io::BufReader::new(&mut s)
                .read_line(&mut line)
                .unwrap();
            let mut out = serde_json::to_vec(&answer).unwrap();
            out.push(b'\n');
            s.write_all(&out).unwrap();
            serde_json::from_str(&line).unwrap()
        });
        let cfg = ClientConfig {
            socket,
            timeout_ms: 5_000,
            ..ClientConfig::default()
        };
        (cfg, served)
    }

    #[test]
    fn an_admitted_container_is_named_by_its_handle() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, asked) = agent(
            dir.path(),
            json!({"ok": true, "adjustment": {
                "devices": [{"path": "/dev/nvidia1", "major": 195, "minor": 1, "file_mode": 438}],
                "env": [["GPUSHARE_GPU_MEMORY_MIB", "2048"]], "clear_env": [], "cdi_devices": [],
                "mounts": [], "cpuset": null}}),
        );
        let input = spec(
            json!({"gpushare.io/granted-mem": "2", "gpushare.io/handle": "someone-elses"}),
            &["PATH=/bin"],
        );
        let (out, admitted) = precreate(&cfg, &input, "hook-00ff").unwrap();
        assert!(admitted);
        let asked = asked.join().unwrap();
        assert_eq!(asked["op"], "create");
        assert_eq!(asked["id"], "hook-00ff");
        assert_eq!(
            asked["spec"]["annotations"]["gpushare.io/handle"], "hook-00ff",
            "the agent sees the spec as it will be"
        );
        assert_eq!(out["annotations"]["gpushare.io/handle"], "hook-00ff");
        assert_eq!(out["annotations"]["gpushare.io/granted-mem"], "2");
        assert_eq!(out["linux"]["devices"][0]["path"], "/dev/nvidia1");
        assert_eq!(
            out["process"]["env"],
            json!(["PATH=/bin", "GPUSHARE_GPU_MEMORY_MIB=2048"])
        );
        assert_eq!(out["someFieldPodmanAdds"], 1, "unknown fields pass through");
    }

    #[test]
    fn a_refusal_is_the_agents_message() {
        let dir = tempfile::tempdir().unwrap();
        let msg = "gpushare: aliyun.com/gpu-core.percentage 33 is not a multiple of 5";
        let (cfg, _) = agent(
            dir.path(),
            json!({"ok": false, "refusal": true, "message": msg}),
        );
        let input = spec(json!({"gpushare.io/granted-core": "33"}), &[]);
        assert_eq!(precreate(&cfg, &input, "hook-1"), Err(msg.to_string()));
    }

    #[test]
    fn without_the_agent_only_gpu_containers_are_refused() {
        let cfg = ClientConfig {
            socket: PathBuf::from("/nonexistent/runtime.sock"),
            ..ClientConfig::default()
        };
        let err = precreate(
            &cfg,
            &spec(json!({"gpushare.io/assignment": "{}"}), &[]),
            "h",
        )
        .unwrap_err();
        assert!(err.contains("GPU containers are refused while"), "{err}");
        let input = spec(json!({}), &["NVIDIA_VISIBLE_DEVICES=all"]);
        let (out, admitted) = precreate(&cfg, &input, "h").unwrap();
        assert!(!admitted);
        assert_eq!(
            out["process"]["env"],
            json!(["NVIDIA_VISIBLE_DEVICES=void"])
        );
        assert!(out["annotations"].get(HANDLE_ANNOTATION).is_none());
        let input = spec(json!({"a": "b"}), &["PATH=/bin"]);
        let (out, _) = precreate(&cfg, &input, "h").unwrap();
        assert_eq!(
            out,
            serde_json::from_slice::<Value>(&input).unwrap(),
            "untouched"
        );
        assert!(
            precreate(&cfg, b"{]", "h")
                .unwrap_err()
                .contains("the spec on stdin")
        );
    }

    #[test]
    fn handles_are_valid_ids() {
        let h = handle_from([0xab; 16]);
        assert_eq!(h, format!("hook-{}", "ab".repeat(16)));
        assert!(super::super::api::check_id(&h).is_ok());
        assert_ne!(new_handle().unwrap(), new_handle().unwrap());
    }

    #[test]
    fn the_handle_from_the_state_or_the_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let state = |v: Value| serde_json::from_value::<State>(v).unwrap();
        // runc's poststart state: the spec's annotations.
        let s = state(
            json!({"ociVersion": "1.0.2", "id": "abc", "status": "running", "pid": 7,
            "bundle": "/nowhere", "annotations": {"gpushare.io/handle": "hook-1"}}),
        );
        assert_eq!(handle_of(&s), Ok(Some("hook-1".into())));
        // podman's poststop state: its own annotations; the handle is in the bundle.
        std::fs::write(
            dir.path().join("config.json"),
            spec(json!({"gpushare.io/handle": "hook-2"}), &[]),
        )
        .unwrap();
        let s = state(
            json!({"ociVersion": "1.0.2", "id": "abc", "status": "stopped",
            "bundle": dir.path(), "annotations": {"gpushare.io/granted-mem": "2"}}),
        );
        assert_eq!(handle_of(&s), Ok(Some("hook-2".into())));
        std::fs::write(dir.path().join("config.json"), spec(json!({}), &[])).unwrap();
        assert_eq!(handle_of(&s), Ok(None), "never admitted");
        let s = state(json!({"id": "abc", "bundle": dir.path().join("gone")}));
        assert!(
            handle_of(&s)
                .unwrap_err()
                .starts_with("container abc: cannot read")
        );
    }
}

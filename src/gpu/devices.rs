//! Discovery of NVIDIA device nodes under an injectable dev root (`/dev` in production, the
//! agent's own directory for simulated GPUs), and of the `nvidia-uvm` major in `/proc/devices`.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use gpushare_core::inventory::{DeviceNode, DeviceSet};

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("cannot read dev root {path}: {source}")]
    ReadDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    ProcDevices {
        path: PathBuf,
        source: std::io::Error,
    },
}

const NVIDIA_UVM_MINOR: i64 = 0;
const NVIDIA_UVM_TOOLS_MINOR: i64 = 1;
const DEVICE_MODE: u32 = 0o666;

fn char_device(path: &Path, container_path: &str) -> Option<DeviceNode> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_char_device() {
        return None;
    }
    let rdev = meta.rdev();
    Some(DeviceNode {
        path: container_path.to_string(),
        major: libc::major(rdev) as i64,
        minor: libc::minor(rdev) as i64,
        file_mode: DEVICE_MODE,
    })
}

/// Parses the character-device section of `/proc/devices` for `name`'s major number.
pub fn major_from_proc_devices(content: &str, name: &str) -> Option<i64> {
    let mut in_char = false;
    for line in content.lines() {
        let line = line.trim();
        if line.starts_with("Character devices") {
            in_char = true;
            continue;
        }
        if line.starts_with("Block devices") {
            in_char = false;
            continue;
        }
        if !in_char {
            continue;
        }
        let mut parts = line.split_whitespace();
        if let (Some(major), Some(dev)) = (parts.next(), parts.next())
            && dev == name
        {
            return major.parse().ok();
        }
    }
    None
}

/// Finds `nvidia<N>`, `nvidiactl`, `nvidia-uvm` and `nvidia-uvm-tools` under `dev_root`.
/// The uvm major comes from `proc_devices` when the driver registered it there (the node may
/// not exist yet on a host where no CUDA program ran), else from the node under `dev_root`.
pub fn discover(dev_root: &Path, proc_devices: &Path) -> Result<DeviceSet, DeviceError> {
    let entries = std::fs::read_dir(dev_root).map_err(|source| DeviceError::ReadDir {
        path: dev_root.to_path_buf(),
        source,
    })?;
    let mut set = DeviceSet::default();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(num) = name.strip_prefix("nvidia") else {
            continue;
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some(node) = char_device(&entry.path(), &format!("/dev/{name}")) {
            set.gpus.insert(node.minor as u32, node);
        }
    }
    set.ctl = char_device(&dev_root.join("nvidiactl"), "/dev/nvidiactl");
    let uvm_major = match std::fs::read_to_string(proc_devices) {
        Ok(content) => major_from_proc_devices(&content, "nvidia-uvm"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(DeviceError::ProcDevices {
                path: proc_devices.to_path_buf(),
                source,
            });
        }
    };
    match uvm_major {
        Some(major) => {
            set.uvm = Some(DeviceNode {
                path: "/dev/nvidia-uvm".into(),
                major,
                minor: NVIDIA_UVM_MINOR,
                file_mode: DEVICE_MODE,
            });
            set.uvm_tools = Some(DeviceNode {
                path: "/dev/nvidia-uvm-tools".into(),
                major,
                minor: NVIDIA_UVM_TOOLS_MINOR,
                file_mode: DEVICE_MODE,
            });
        }
        None => {
            set.uvm = char_device(&dev_root.join("nvidia-uvm"), "/dev/nvidia-uvm");
            set.uvm_tools =
                char_device(&dev_root.join("nvidia-uvm-tools"), "/dev/nvidia-uvm-tools");
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia-frontend\n 508 nvidia-uvm\n\nBlock devices:\n  8 sd\n 509 nvidia-uvm\n";

    #[test]
    fn uvm_major_comes_from_char_section_only() {
        assert_eq!(
            major_from_proc_devices(PROC_DEVICES, "nvidia-uvm"),
            Some(508)
        );
        assert_eq!(major_from_proc_devices(PROC_DEVICES, "sd"), None);
        assert_eq!(major_from_proc_devices(PROC_DEVICES, "nvidia-caps"), None);
    }

    #[test]
    fn discovers_nodes_under_dev_root() {
        let dir = tempfile::tempdir().unwrap();
        if nix::unistd::geteuid().is_root() {
            crate::gpu::sim::create_device_nodes(dir.path(), &[0, 1, 3]).unwrap();
            std::fs::write(dir.path().join("nvidia-modeset"), b"").unwrap();
            let proc = dir.path().join("devices");
            std::fs::write(&proc, PROC_DEVICES).unwrap();
            let set = discover(dir.path(), &proc).unwrap();
            assert_eq!(set.gpus.keys().copied().collect::<Vec<_>>(), vec![0, 1, 3]);
            assert_eq!(set.gpus[&3].path, "/dev/nvidia3");
            assert_eq!((set.gpus[&3].major, set.gpus[&3].minor), (195, 3));
            assert_eq!(set.ctl.as_ref().unwrap().minor, 255);
            assert_eq!(set.uvm.as_ref().unwrap().major, 508);
            assert_eq!(set.uvm_tools.as_ref().unwrap().minor, 1);
        } else {
            // Without root there are no device nodes to create; plain files are ignored.
            std::fs::write(dir.path().join("nvidia0"), b"").unwrap();
            let set = discover(dir.path(), &dir.path().join("missing")).unwrap();
            assert!(set.gpus.is_empty() && set.ctl.is_none() && set.uvm.is_none());
        }
    }

    #[test]
    fn missing_dev_root_names_the_path() {
        let err = discover(Path::new("/nonexistent/dev"), Path::new("/proc/devices")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/dev"), "{err}");
    }
}

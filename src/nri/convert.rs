//! Plain data ↔ NRI protocol types.

use super::api::nri_api::{
    CDIDevice, ContainerAdjustment, KeyValue, LinuxCPU, LinuxContainerAdjustment, LinuxDevice,
    LinuxResources, Mount, OptionalFileMode,
};
use gpushare_core::adjust::Adjustment;

/// The protocol form of an [`Adjustment`].
pub fn adjustment(adj: &Adjustment) -> ContainerAdjustment {
    let devices = adj
        .devices
        .iter()
        .map(|d| LinuxDevice {
            path: d.path.clone(),
            type_: "c".into(),
            major: d.major,
            minor: d.minor,
            file_mode: Some(OptionalFileMode {
                value: d.file_mode,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        })
        .collect();
    ContainerAdjustment {
        env: adj
            .env
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: v.clone(),
                ..Default::default()
            })
            .chain(adj.clear_env.iter().map(|k| KeyValue {
                key: k.clone(),
                value: String::new(),
                ..Default::default()
            }))
            .collect(),
        linux: Some(LinuxContainerAdjustment {
            devices,
            resources: adj
                .cpuset
                .as_ref()
                .map(|cpus| LinuxResources {
                    cpu: Some(LinuxCPU {
                        cpus: cpus.clone(),
                        ..Default::default()
                    })
                    .into(),
                    ..Default::default()
                })
                .into(),
            ..Default::default()
        })
        .into(),
        mounts: adj
            .mounts
            .iter()
            .map(|m| Mount {
                source: m.source.clone(),
                destination: m.destination.clone(),
                type_: "bind".into(),
                options: vec!["rbind".into(), if m.read_only { "ro" } else { "rw" }.into()],
                ..Default::default()
            })
            .collect(),
        CDI_devices: adj
            .cdi_devices
            .iter()
            .map(|n| CDIDevice {
                name: n.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

//! GPU health for the device plugin and the `gpushare.io/gpus` node annotation: a probe per
//! backend, polled by [`poll`]. NVML: a GPU is unhealthy when it cannot be reached (fallen
//! off the bus, `GpuLost`, any query failing) or when its volatile uncorrected ECC count grows
//! after the agent started. Simulated GPUs: the indexes listed in `<state_dir>/sim/unhealthy`
//! (whitespace-separated), so tests and demos can fail a GPU.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::NvmlError;

/// GPU indexes that must not be handed out.
pub type Unhealthy = BTreeSet<u32>;

/// One health reading of every GPU.
pub trait HealthProbe: Send {
    fn unhealthy(&mut self) -> Unhealthy;
}

/// Simulated GPUs: unhealthy are the indexes listed in a file (missing file: all healthy).
pub struct SimHealth {
    file: PathBuf,
}

/// Name of the sim health file inside the agent's sim directory.
pub const SIM_UNHEALTHY_FILE: &str = "unhealthy";

impl SimHealth {
    pub fn new(sim_dir: impl Into<PathBuf>) -> SimHealth {
        SimHealth {
            file: sim_dir.into().join(SIM_UNHEALTHY_FILE),
        }
    }
}

impl HealthProbe for SimHealth {
    fn unhealthy(&mut self) -> Unhealthy {
        let Ok(text) = std::fs::read_to_string(&self.file) else {
            return Unhealthy::new();
        };
        text.split_whitespace()
            .filter_map(|w| match w.parse() {
                Ok(i) => Some(i),
                Err(_) => {
                    tracing::warn!(file = %self.file.display(), entry = w, "not a GPU index; ignored");
                    None
                }
            })
            .collect()
    }
}

/// Real GPUs through NVML.
pub struct NvmlHealth {
    nvml: Arc<Nvml>,
    indexes: Vec<u32>,
    /// Volatile uncorrected ECC errors per GPU when first read (`None`: not supported).
    ecc_base: HashMap<u32, Option<u64>>,
}

impl NvmlHealth {
    pub fn new(nvml: Arc<Nvml>, indexes: Vec<u32>) -> NvmlHealth {
        NvmlHealth {
            nvml,
            indexes,
            ecc_base: HashMap::new(),
        }
    }

    fn check(&mut self, index: u32) -> Result<(), String> {
        let dev = self
            .nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML cannot reach it: {e}"))?;
        dev.memory_info()
            .map_err(|e| format!("NVML memory query failed: {e}"))?;
        let ecc = match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
            Ok(n) => Some(n),
            Err(NvmlError::NotSupported) => None,
            Err(e) => return Err(format!("NVML ECC query failed: {e}")),
        };
        let base = *self.ecc_base.entry(index).or_insert(ecc);
        if let (Some(base), Some(now)) = (base, ecc)
            && now > base
        {
            return Err(format!(
                "{} uncorrected ECC error(s) since the agent started",
                now - base
            ));
        }
        Ok(())
    }
}

impl HealthProbe for NvmlHealth {
    fn unhealthy(&mut self) -> Unhealthy {
        let mut out = Unhealthy::new();
        for index in self.indexes.clone() {
            if let Err(why) = self.check(index) {
                tracing::warn!(gpu = index, %why, "GPU unhealthy");
                out.insert(index);
            }
        }
        out
    }
}

/// Reads `probe` every `period` (on a blocking thread: NVML calls block) and hands each
/// reading to `publish`, which the device plugin turns into device health and the node
/// annotation. Runs until the task is dropped.
pub async fn poll(
    probe: Box<dyn HealthProbe>,
    period: Duration,
    wake: Arc<tokio::sync::Notify>,
    publish: impl Fn(Unhealthy) + Send + 'static,
) {
    let probe = Arc::new(std::sync::Mutex::new(probe));
    loop {
        let p = probe.clone();
        match tokio::task::spawn_blocking(move || p.lock().expect("health probe").unhealthy()).await
        {
            Ok(unhealthy) => publish(unhealthy),
            Err(e) => tracing::error!(error = %e, "GPU health probe failed"),
        }
        // Every period, or at once when `wake` says what is published may have changed.
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_health_reads_the_listed_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let mut probe = SimHealth::new(dir.path());
        assert!(probe.unhealthy().is_empty(), "no file: all healthy");
        std::fs::write(dir.path().join(SIM_UNHEALTHY_FILE), "1\n3 x\n").unwrap();
        assert_eq!(probe.unhealthy(), Unhealthy::from([1, 3]));
        std::fs::write(dir.path().join(SIM_UNHEALTHY_FILE), "").unwrap();
        assert!(probe.unhealthy().is_empty());
    }

    #[tokio::test]
    async fn poll_publishes_every_reading() {
        struct Flaky(u32);
        impl HealthProbe for Flaky {
            fn unhealthy(&mut self) -> Unhealthy {
                self.0 += 1;
                if self.0.is_multiple_of(2) {
                    Unhealthy::from([2])
                } else {
                    Unhealthy::new()
                }
            }
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let wake = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn(poll(
            Box::new(Flaky(0)),
            Duration::from_millis(1),
            wake.clone(),
            move |u| {
                let _ = tx.send(u);
            },
        ));
        let first = rx.recv().await.unwrap();
        let second = rx.recv().await.unwrap();
        task.abort();
        assert_eq!((first, second), (Unhealthy::new(), Unhealthy::from([2])));

        // A period of an hour: the second reading comes when woken.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(poll(
            Box::new(Flaky(0)),
            Duration::from_secs(3600),
            wake.clone(),
            move |u| {
                let _ = tx.send(u);
            },
        ));
        assert_eq!(rx.recv().await.unwrap(), Unhealthy::new());
        wake.notify_one();
        let second = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        task.abort();
        assert_eq!(second.unwrap().unwrap(), Unhealthy::from([2]));
    }
}

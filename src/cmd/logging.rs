//! `tracing` setup: text or JSON, to stderr or a file. A pre-installed plugin learns its log
//! file only from the runtime's `Configure`, so the destination and format can change once
//! the subscriber is installed.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use crate::config::{LogConfig, LogFormat};

static DEST: Mutex<Option<File>> = Mutex::new(None);
type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;
static RELOAD: OnceLock<reload::Handle<BoxedLayer, Registry>> = OnceLock::new();

/// Writes to the configured file, else stderr.
#[derive(Clone, Copy)]
struct Dest;

impl Write for Dest {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match DEST.lock().expect("log lock").as_mut() {
            Some(f) => f.write(buf),
            None => std::io::stderr().write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match DEST.lock().expect("log lock").as_mut() {
            Some(f) => f.flush(),
            None => std::io::stderr().flush(),
        }
    }
}

fn layer(format: LogFormat, level: &str) -> BoxedLayer {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let base = tracing_subscriber::fmt::layer()
        .with_writer(|| Dest)
        .with_ansi(false);
    match format {
        LogFormat::Text => base.with_filter(filter).boxed(),
        LogFormat::Json => base
            .json()
            .with_current_span(true)
            .with_filter(filter)
            .boxed(),
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Installs the global subscriber.
pub fn init(cfg: &LogConfig) -> anyhow::Result<()> {
    if let Some(path) = &cfg.file {
        *DEST.lock().expect("log lock") = Some(open(path)?);
    }
    let (layer, handle) = reload::Layer::new(layer(cfg.format, &cfg.level));
    tracing_subscriber::registry().with(layer).try_init()?;
    let _ = RELOAD.set(handle);
    Ok(())
}

/// Applies a new log configuration to the installed subscriber.
pub fn reconfigure(cfg: &LogConfig) {
    if let Some(path) = &cfg.file {
        match open(path) {
            Ok(f) => *DEST.lock().expect("log lock") = Some(f),
            Err(e) => tracing::error!(path = %path.display(), error = %e, "cannot open log file"),
        }
    }
    if let Some(h) = RELOAD.get() {
        let _ = h.reload(layer(cfg.format, &cfg.level));
    }
}

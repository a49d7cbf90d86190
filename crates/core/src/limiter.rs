//! The contract between the node agent and the in-container limiter library: where the
//! library, its limits file and its accounting region live inside a container, the limits file
//! (JSON the agent writes read-only), and the shared accounting region's binary layout.
//!
//! Pure: the agent renders the limits file and the region's initial image from these types;
//! the limiter (a `cdylib` loaded into every process of a GPU container) parses the same file
//! and maps the same layout. The region is writable by the container and therefore untrusted:
//! the limiter validates its header, and the agent's NVML backstop holds whatever a container
//! does to it.
//!
//! Region layout (native endianness, little on every platform we ship):
//! `[RegionHeader; 1]` (64 bytes) followed by `REGION_SLOTS` × [`RegionSlot`]. A process claims
//! a slot by a single compare-and-swap of the slot's owner word from 0 to its [`OwnerWord`]
//! (pid + start time), counts its allocations per GPU in the slot's `used` words, and the
//! container's usage of a GPU is the sum over owned slots. A slot whose process died is
//! reclaimed by whoever notices (owner CAS back to 0); no lock exists that a dead process
//! could hold.

use std::sync::atomic::{AtomicU32, AtomicU64};

use serde::{Deserialize, Serialize};

use crate::echo::Echo;
use crate::json::{self, Json, Path, SchemaError};

/// The limiter library inside a container (bind-mounted read-only by the agent).
pub const LIBRARY_PATH: &str = "/usr/lib/gpushare/libgpushare_limiter.so";
/// The container's limits (bind-mounted read-only; rendered by [`LimitsFile::render`]).
pub const LIMITS_PATH: &str = "/etc/gpushare/limits.json";
/// The container's shared accounting region (created by the agent, [`region_image`]).
pub const REGION_PATH: &str = "/var/run/gpushare/region";
/// The loader's preload list; the agent mounts a read-only file naming [`LIBRARY_PATH`].
pub const PRELOAD_PATH: &str = "/etc/ld.so.preload";

/// The limits file version this build writes and reads.
pub const LIMITS_VERSION: u32 = 1;
/// Most GPUs one container's limits may name (the region has one counter per GPU per slot).
pub const MAX_GPUS: usize = 16;

/// Largest limits file read (one of [`MAX_GPUS`] GPUs is a few hundred bytes).
pub const MAX_LIMITS_FILE_BYTES: usize = 64 * 1024;

/// What the agent writes to [`LIMITS_PATH`] for one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    pub version: u32,
    /// The GPUs visible in the container, in the order the agent exposed them. The limiter
    /// matches a CUDA device or NVML handle by UUID, falling back to its position here.
    pub gpus: Vec<GpuLimit>,
}

/// The memory quota of one GPU visible in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuLimit {
    /// Host index of the GPU (as NVML on the node numbers it).
    pub index: u32,
    /// NVML UUID, `GPU-xxxxxxxx-…`.
    pub uuid: String,
    pub memory_limit_bytes: u64,
}

impl GpuLimit {
    fn from_tree(v: &Json, path: &Path) -> Result<GpuLimit, SchemaError> {
        let o = json::object(v, path, "an object with index, uuid and memory_limit_bytes")?;
        o.deny_unknown(path, &["index", "uuid", "memory_limit_bytes"])?;
        let index = json::integer(
            o.required(path, "index", "an integer in [0, 4294967295]")?,
            &path.field("index"),
            0,
            u32::MAX.into(),
        )? as u32;
        let uuid = json::string(
            o.required(path, "uuid", "a GPU UUID string")?,
            &path.field("uuid"),
            "a GPU UUID string",
        )?
        .to_string();
        let memory_limit_bytes = json::integer(
            o.required(
                path,
                "memory_limit_bytes",
                "an integer in [0, 18446744073709551615]",
            )?,
            &path.field("memory_limit_bytes"),
            0,
            u64::MAX.into(),
        )? as u64;
        Ok(GpuLimit {
            index,
            uuid,
            memory_limit_bytes,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// Far larger than any limits file the agent writes.
    #[error("limits file is malformed: {0} bytes, at most {MAX_LIMITS_FILE_BYTES} are read")]
    TooLarge(usize),
    /// Not JSON at all (a syntax error).
    #[error("limits file is malformed: {0}")]
    Malformed(String),
    /// JSON, but a field is not what the file takes (the path names it).
    #[error("limits file {0}")]
    Schema(SchemaError),
    #[error("limits file version {0} is not supported (this build reads version {LIMITS_VERSION})")]
    UnsupportedVersion(u32),
    #[error("limits file gpus is empty")]
    NoGpus,
    #[error("limits file gpus has {0} entries, at most {MAX_GPUS} are supported")]
    TooManyGpus(usize),
    #[error("limits file gpus[{position}].memory_limit_bytes 0 is not a quota")]
    ZeroLimit { position: usize },
    #[error("limits file gpus[{position}].uuid {uuid} is not a GPU UUID")]
    BadUuid { position: usize, uuid: Echo },
    #[error("limits file gpus[{position}].index {index} is listed twice")]
    DuplicateIndex { position: usize, index: u32 },
    #[error("limits file gpus[{position}].uuid {uuid:#} is listed twice")]
    DuplicateUuid { position: usize, uuid: Echo },
}

impl From<SchemaError> for LimitsError {
    fn from(e: SchemaError) -> Self {
        LimitsError::Schema(e)
    }
}

impl LimitsFile {
    pub fn new(gpus: Vec<GpuLimit>) -> LimitsFile {
        LimitsFile {
            version: LIMITS_VERSION,
            gpus,
        }
    }

    /// Parses and validates the file's text (the one place the format is read). Errors name
    /// the field path (`gpus[0].memory_limit_bytes`) and show values cut.
    pub fn parse(raw: &str) -> Result<LimitsFile, LimitsError> {
        if raw.len() > MAX_LIMITS_FILE_BYTES {
            return Err(LimitsError::TooLarge(raw.len()));
        }
        let tree = json::parse(raw).map_err(|e| LimitsError::Malformed(e.0))?;
        let root = Path::root();
        let top = json::object(&tree, &root, "an object with version and gpus")?;
        // The version first, so that a newer file says so rather than "unknown field".
        let version = top.version(&root)?;
        if version != LIMITS_VERSION {
            return Err(LimitsError::UnsupportedVersion(version));
        }
        top.deny_unknown(&root, &["version", "gpus"])?;
        let path = root.field("gpus");
        let items = json::array(
            top.required(&root, "gpus", "a list of GPU limits")?,
            &path,
            "a list of GPU limits",
        )?;
        if items.len() > MAX_GPUS {
            return Err(LimitsError::TooManyGpus(items.len()));
        }
        let gpus = items
            .iter()
            .enumerate()
            .map(|(i, v)| GpuLimit::from_tree(v, &path.index(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let file = LimitsFile { version, gpus };
        file.validate()?;
        Ok(file)
    }

    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.version != LIMITS_VERSION {
            return Err(LimitsError::UnsupportedVersion(self.version));
        }
        if self.gpus.is_empty() {
            return Err(LimitsError::NoGpus);
        }
        if self.gpus.len() > MAX_GPUS {
            return Err(LimitsError::TooManyGpus(self.gpus.len()));
        }
        for (position, gpu) in self.gpus.iter().enumerate() {
            if gpu.memory_limit_bytes == 0 {
                return Err(LimitsError::ZeroLimit { position });
            }
            if gpu.uuid.is_empty() || gpu.uuid.chars().any(|c| c.is_whitespace() || c == '\0') {
                return Err(LimitsError::BadUuid {
                    position,
                    uuid: Echo::new(&gpu.uuid),
                });
            }
            let earlier = &self.gpus[..position];
            if earlier.iter().any(|g| g.index == gpu.index) {
                return Err(LimitsError::DuplicateIndex {
                    position,
                    index: gpu.index,
                });
            }
            if earlier.iter().any(|g| g.uuid == gpu.uuid) {
                return Err(LimitsError::DuplicateUuid {
                    position,
                    uuid: Echo::new(&gpu.uuid),
                });
            }
        }
        Ok(())
    }

    /// The file's text, as the agent writes it.
    pub fn render(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("limits file serializes");
        text.push('\n');
        text
    }

    /// Position in [`LimitsFile::gpus`] of the GPU with this UUID.
    pub fn position_of_uuid(&self, uuid: &str) -> Option<usize> {
        self.gpus.iter().position(|g| g.uuid == uuid)
    }
}

/// Formats a 16-byte CUDA `CUuuid` the way NVML prints UUIDs: `GPU-8-4-4-4-12` lowercase hex.
pub fn format_gpu_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// `b"GPUSHRG1"` read as a native u64.
pub const REGION_MAGIC: u64 = u64::from_ne_bytes(*b"GPUSHRG1");
pub const REGION_VERSION: u32 = 1;
/// Processes of one container that may hold GPU memory at once.
pub const REGION_SLOTS: usize = 128;

/// The region's first 64 bytes. Fields are atomics because the region is shared memory;
/// the agent writes the header once, before any process of the container starts.
#[repr(C)]
pub struct RegionHeader {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub header_size: AtomicU32,
    pub slot_size: AtomicU32,
    pub slot_count: AtomicU32,
    pub reserved: [AtomicU64; 5],
}

/// One process's counters: owner word (0 = free, else an [`OwnerWord`]) and bytes in use on
/// each GPU of the limits file, by position.
#[repr(C, align(64))]
pub struct RegionSlot {
    pub owner: AtomicU64,
    pub used: [AtomicU64; MAX_GPUS],
}

pub const REGION_HEADER_SIZE: usize = std::mem::size_of::<RegionHeader>();
pub const REGION_SLOT_SIZE: usize = std::mem::size_of::<RegionSlot>();
/// Offset of slot 0: right after the header, which is exactly one slot alignment long.
pub const REGION_SLOTS_OFFSET: usize = REGION_HEADER_SIZE;
pub const REGION_SIZE: usize = REGION_SLOTS_OFFSET + REGION_SLOTS * REGION_SLOT_SIZE;

const _: () = assert!(REGION_HEADER_SIZE == 64);
const _: () = assert!(REGION_SLOT_SIZE.is_multiple_of(64));
const _: () = assert!(std::mem::align_of::<RegionSlot>() == 64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    #[error("region is {len} bytes, expected at least {REGION_SIZE}")]
    TooSmall { len: usize },
    #[error("region magic {0:#018x} is not gpushare's")]
    BadMagic(u64),
    #[error("region version {0} is not supported (this build maps version {REGION_VERSION})")]
    UnsupportedVersion(u32),
    #[error("region {field} {value} does not match this build's {expected}")]
    Layout {
        field: &'static str,
        value: u32,
        expected: u32,
    },
}

impl RegionHeader {
    /// Checks a mapped header against this build's layout; `len` is the mapping's length.
    pub fn check(&self, len: usize) -> Result<(), RegionError> {
        use std::sync::atomic::Ordering::Acquire;
        if len < REGION_SIZE {
            return Err(RegionError::TooSmall { len });
        }
        let magic = self.magic.load(Acquire);
        if magic != REGION_MAGIC {
            return Err(RegionError::BadMagic(magic));
        }
        let version = self.version.load(Acquire);
        if version != REGION_VERSION {
            return Err(RegionError::UnsupportedVersion(version));
        }
        for (field, value, expected) in [
            ("header_size", &self.header_size, REGION_SLOTS_OFFSET),
            ("slot_size", &self.slot_size, REGION_SLOT_SIZE),
            ("slot_count", &self.slot_count, REGION_SLOTS),
        ] {
            let value = value.load(Acquire);
            if value as usize != expected {
                return Err(RegionError::Layout {
                    field,
                    value,
                    expected: expected as u32,
                });
            }
        }
        Ok(())
    }
}

/// The bytes the agent writes to a new region file: the header, every slot free.
pub fn region_image() -> Vec<u8> {
    let mut image = vec![0u8; REGION_SIZE];
    image[0..8].copy_from_slice(&REGION_MAGIC.to_ne_bytes());
    image[8..12].copy_from_slice(&REGION_VERSION.to_ne_bytes());
    image[12..16].copy_from_slice(&(REGION_SLOTS_OFFSET as u32).to_ne_bytes());
    image[16..20].copy_from_slice(&(REGION_SLOT_SIZE as u32).to_ne_bytes());
    image[20..24].copy_from_slice(&(REGION_SLOTS as u32).to_ne_bytes());
    image
}

/// A slot's owner: pid in the high 32 bits; the low 31 bits of the process start time (clock
/// ticks since boot, `/proc/PID/stat` field 22) below; bit 31 set while the owner is still
/// zeroing the slot's counters (readers skip such a slot). Never 0 for a real process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerWord(pub u64);

const CLAIMING_BIT: u64 = 1 << 31;
const START_MASK: u64 = CLAIMING_BIT - 1;

impl OwnerWord {
    pub const FREE: u64 = 0;

    pub fn new(pid: u32, start_time: u64) -> OwnerWord {
        OwnerWord((u64::from(pid) << 32) | (start_time & START_MASK))
    }

    pub fn pid(self) -> u32 {
        (self.0 >> 32) as u32
    }

    pub fn claiming(self) -> OwnerWord {
        OwnerWord(self.0 | CLAIMING_BIT)
    }

    pub fn is_claiming(self) -> bool {
        self.0 & CLAIMING_BIT != 0
    }

    /// The word without the claiming bit (what the owner stores once its counters are zero).
    pub fn settled(self) -> OwnerWord {
        OwnerWord(self.0 & !CLAIMING_BIT)
    }

    /// Whether a process with this start time is the owner (pid already matched).
    pub fn same_start(self, start_time: u64) -> bool {
        self.0 & START_MASK == start_time & START_MASK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_gib() -> LimitsFile {
        LimitsFile::new(vec![GpuLimit {
            index: 1,
            uuid: "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
            memory_limit_bytes: 2 << 30,
        }])
    }

    #[test]
    fn render_then_parse_round_trips() {
        let file = two_gib();
        let text = file.render();
        assert!(text.contains("\"memory_limit_bytes\": 2147483648"));
        assert_eq!(LimitsFile::parse(&text).unwrap(), file);
        assert_eq!(
            file.position_of_uuid("GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"),
            Some(0)
        );
        assert_eq!(file.position_of_uuid("GPU-other"), None);
    }

    #[test]
    fn parse_errors_name_field_and_value() {
        let err = |raw: &str| LimitsFile::parse(raw).unwrap_err().to_string();
        assert!(err("not json").contains("malformed"));
        assert_eq!(
            err(r#"{"version": 7, "gpus": []}"#),
            "limits file version 7 is not supported (this build reads version 1)"
        );
        assert_eq!(
            err(r#"{"version": 1, "gpus": []}"#),
            "limits file gpus is empty"
        );
        let e = err(r#"{"version": 1, "gpus": [{"index": 0, "uuid": "GPU-a"}]}"#);
        assert!(e.contains("memory_limit_bytes"), "{e}");
        let e = err(
            r#"{"version": 1, "gpus": [{"index": 0, "uuid": "GPU-a", "memory_limit_bytes": -1}]}"#,
        );
        assert!(e.contains("-1"), "{e}");
        let e = err(
            r#"{"version": 1, "gpus": [{"index": 0, "uuid": "GPU-a", "memory_limit_bytes": 1, "extra": 1}]}"#,
        );
        assert!(e.contains("extra"), "{e}");
        assert_eq!(
            err(
                r#"{"version": 1, "gpus": [{"index": 0, "uuid": "GPU-a", "memory_limit_bytes": 0}]}"#
            ),
            "limits file gpus[0].memory_limit_bytes 0 is not a quota"
        );
        assert_eq!(
            err(r#"{"version": 1, "gpus": [{"index": 0, "uuid": "", "memory_limit_bytes": 5}]}"#),
            "limits file gpus[0].uuid \"\" is not a GPU UUID"
        );
        assert_eq!(
            err(
                r#"{"version": 1, "gpus": [{"index": 0, "uuid": "a", "memory_limit_bytes": 5},
                {"index": 0, "uuid": "b", "memory_limit_bytes": 5}]}"#
            ),
            "limits file gpus[1].index 0 is listed twice"
        );
        assert_eq!(
            err(
                r#"{"version": 1, "gpus": [{"index": 0, "uuid": "a", "memory_limit_bytes": 5},
                {"index": 1, "uuid": "a", "memory_limit_bytes": 5}]}"#
            ),
            "limits file gpus[1].uuid a is listed twice"
        );
        let many = LimitsFile::new(
            (0..17)
                .map(|i| GpuLimit {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    memory_limit_bytes: 1,
                })
                .collect(),
        );
        assert_eq!(
            LimitsFile::parse(&many.render()).unwrap_err(),
            LimitsError::TooManyGpus(17)
        );
    }

    #[test]
    fn region_image_passes_its_own_check_and_corruption_is_named() {
        let image = region_image();
        assert_eq!(image.len(), REGION_SIZE);
        assert_eq!(REGION_SIZE, 64 + REGION_SLOTS * REGION_SLOT_SIZE);
        // Reinterpret as the header the limiter maps (aligned copy).
        let header = |bytes: &[u8]| {
            let h = RegionHeader {
                magic: AtomicU64::new(u64::from_ne_bytes(bytes[0..8].try_into().unwrap())),
                version: AtomicU32::new(u32::from_ne_bytes(bytes[8..12].try_into().unwrap())),
                header_size: AtomicU32::new(u32::from_ne_bytes(bytes[12..16].try_into().unwrap())),
                slot_size: AtomicU32::new(u32::from_ne_bytes(bytes[16..20].try_into().unwrap())),
                slot_count: AtomicU32::new(u32::from_ne_bytes(bytes[20..24].try_into().unwrap())),
                reserved: Default::default(),
            };
            h.check(bytes.len())
        };
        assert_eq!(header(&image), Ok(()));
        assert_eq!(
            header(&image[..100]),
            Err(RegionError::TooSmall { len: 100 })
        );
        let mut bad = image.clone();
        bad[0] ^= 1;
        assert!(matches!(header(&bad), Err(RegionError::BadMagic(_))));
        let mut bad = image.clone();
        bad[8] = 9;
        assert_eq!(header(&bad), Err(RegionError::UnsupportedVersion(9)));
        let mut bad = image;
        bad[20] = 3;
        assert_eq!(
            header(&bad).unwrap_err().to_string(),
            format!("region slot_count 3 does not match this build's {REGION_SLOTS}")
        );
    }

    #[test]
    fn owner_word_packs_pid_and_start_time() {
        let w = OwnerWord::new(4242, 0x1_2345_6789);
        assert_ne!(w.0, OwnerWord::FREE);
        assert_eq!(w.pid(), 4242);
        assert!(w.same_start(0x1_2345_6789));
        assert!(!w.same_start(0x1_2345_6788));
        assert!(!w.is_claiming());
        let c = w.claiming();
        assert!(c.is_claiming());
        assert_eq!(c.pid(), 4242);
        assert_eq!(c.settled(), w);
        assert_ne!(OwnerWord::new(1, 0).0, OwnerWord::FREE);
    }

    #[test]
    fn uuid_formats_like_nvml() {
        let bytes = [
            0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2,
            0xe1, 0xf0,
        ];
        assert_eq!(
            format_gpu_uuid(&bytes),
            "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
        );
    }
}

//! Keeps README.md's "Configuration reference" true: every key of the node config
//! (`install/node.toml`, `NodeConfig`) and of the runtime-level modes' config
//! (`install/runtime.toml`, `ClientConfig`), and every long flag of every subcommand, is named
//! there as `` `name` `` — node keys as dotted TOML paths (`throttle.period_ms`), flags as
//! `--flag` — in the subsection whose heading names the file or `gpushare <subcommand>`.
//! A missing name fails the test with the whole list.
//!
//! Key paths come from two walkers, united:
//! - [`serialized_paths`]: `NodeConfig::default()` serialized (serde_json, so `None` is a
//!   `null` key, not dropped) and walked;
//! - [`traced_paths`]: a deserializer that answers serde's `deserialize_struct` by recording
//!   the field list it is given and descending into every field, `Option`s and `Vec`
//!   elements included. It finds what serializing the defaults cannot: fields skipped when
//!   `None` (`throttle.context_allowance_mib`), the entries of lists empty by default
//!   (`sim.gpu.index`, …), and structs that only deserialize (`ClientConfig`).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use gpushare::cmd;
use gpushare::config::NodeConfig;
use gpushare::runtime::client::ClientConfig;

// --- the walkers --------------------------------------------------------------------------

/// Every key path of a serialized value: objects' keys joined with `.`; array elements
/// (arrays of tables) add their keys under the array's own path.
fn serialized_paths(v: &serde_json::Value) -> BTreeSet<String> {
    fn walk(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let path = join(prefix, k);
                    out.insert(path.clone());
                    walk(v, &path, out);
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, prefix, out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(v, "", &mut out);
    out
}

/// Every key path `T` deserializes (see the module comment).
fn traced_paths<'de, T: serde::Deserialize<'de>>() -> Result<BTreeSet<String>, String> {
    let out = RefCell::new(BTreeSet::new());
    T::deserialize(Tracer {
        path: String::new(),
        out: &out,
    })
    .map_err(|e| e.0)?;
    Ok(out.into_inner())
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// The paths that are no other path's prefix: the keys an operator writes a value for.
fn leaves(paths: &BTreeSet<String>) -> BTreeSet<String> {
    paths
        .iter()
        .filter(|p| {
            let below = format!("{p}.");
            !paths.iter().any(|q| q.starts_with(&below))
        })
        .cloned()
        .collect()
}

#[derive(Debug)]
struct TraceError(String);

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

impl de::Error for TraceError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        TraceError(msg.to_string())
    }
}

/// A deserializer that hands out a neutral value for every leaf and records struct fields.
#[derive(Clone, Copy)]
struct TracerRef<'a> {
    out: &'a RefCell<BTreeSet<String>>,
}

struct Tracer<'a> {
    path: String,
    out: &'a RefCell<BTreeSet<String>>,
}

impl<'a> Tracer<'a> {
    fn at(r: TracerRef<'a>, path: String) -> Self {
        Tracer { path, out: r.out }
    }
    fn r(&self) -> TracerRef<'a> {
        TracerRef { out: self.out }
    }
}

macro_rules! leaf {
    ($($method:ident => $visit:ident($($value:expr)?)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
            v.$visit($($value)?)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Tracer<'_> {
    type Error = TraceError;

    // A value of unknown type (a hand-written `Deserialize`): a boolean is what those of the
    // node config take (`device_plugin.core` = true/false/"auto").
    leaf! {
        deserialize_any => visit_bool(false),
        deserialize_bool => visit_bool(false),
        deserialize_i8 => visit_u64(0),
        deserialize_i16 => visit_u64(0),
        deserialize_i32 => visit_u64(0),
        deserialize_i64 => visit_u64(0),
        deserialize_u8 => visit_u64(0),
        deserialize_u16 => visit_u64(0),
        deserialize_u32 => visit_u64(0),
        deserialize_u64 => visit_u64(0),
        deserialize_f32 => visit_f64(0.0),
        deserialize_f64 => visit_f64(0.0),
        deserialize_char => visit_char('x'),
        deserialize_str => visit_str(""),
        deserialize_string => visit_str(""),
        deserialize_bytes => visit_bytes(&[]),
        deserialize_byte_buf => visit_bytes(&[]),
        deserialize_unit => visit_unit(),
        deserialize_identifier => visit_str(""),
        deserialize_ignored_any => visit_unit(),
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        v.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, TraceError> {
        v.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, TraceError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        v.visit_seq(Elements {
            left: 1,
            path: self.path.clone(),
            r: self.r(),
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, TraceError> {
        v.visit_seq(Elements {
            left: len,
            path: self.path.clone(),
            r: self.r(),
        })
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        v: V,
    ) -> Result<V::Value, TraceError> {
        self.deserialize_tuple(len, v)
    }

    /// A map with keys of its own (no fixed fields): nothing to record.
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, TraceError> {
        v.visit_map(Fields {
            fields: &[],
            next: 0,
            path: self.path.clone(),
            r: self.r(),
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, TraceError> {
        {
            let mut out = self.out.borrow_mut();
            for f in fields {
                out.insert(join(&self.path, f));
            }
        }
        v.visit_map(Fields {
            fields,
            next: 0,
            path: self.path.clone(),
            r: self.r(),
        })
    }

    /// An enum: its first variant, as a unit variant.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, TraceError> {
        let first = variants
            .first()
            .ok_or_else(|| TraceError(format!("{}: enum {name} has no variants", self.path)))?;
        v.visit_enum(UnitVariant(first))
    }
}

/// The elements of a list: `left` of them, each traced under the list's own path.
struct Elements<'a> {
    left: usize,
    path: String,
    r: TracerRef<'a>,
}

impl<'de> de::SeqAccess<'de> for Elements<'_> {
    type Error = TraceError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, TraceError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(Tracer::at(self.r, self.path.clone()))
            .map(Some)
    }
}

/// A struct's fields, each given once, its value traced under `path.field`.
struct Fields<'a> {
    fields: &'static [&'static str],
    next: usize,
    path: String,
    r: TracerRef<'a>,
}

impl<'de> de::MapAccess<'de> for Fields<'_> {
    type Error = TraceError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, TraceError> {
        let Some(f) = self.fields.get(self.next) else {
            return Ok(None);
        };
        let key: de::value::StrDeserializer<'_, TraceError> = f.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, TraceError> {
        let f = self.fields[self.next];
        self.next += 1;
        seed.deserialize(Tracer::at(self.r, join(&self.path, f)))
    }
}

struct UnitVariant(&'static str);

impl<'de> de::EnumAccess<'de> for UnitVariant {
    type Error = TraceError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self), TraceError> {
        let name: de::value::StrDeserializer<'_, TraceError> = self.0.into_deserializer();
        Ok((seed.deserialize(name)?, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitVariant {
    type Error = TraceError;

    fn unit_variant(self) -> Result<(), TraceError> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _: T) -> Result<T::Value, TraceError> {
        Err(TraceError(format!(
            "variant {} is not a unit variant",
            self.0
        )))
    }
    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, TraceError> {
        Err(TraceError(format!(
            "variant {} is not a unit variant",
            self.0
        )))
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, TraceError> {
        Err(TraceError(format!(
            "variant {} is not a unit variant",
            self.0
        )))
    }
}

// --- the README ---------------------------------------------------------------------------

const README: &str = include_str!("../README.md");
const SECTION: &str = "## Configuration reference";

/// The text of the `##` section titled `title`, up to the next `##` heading.
fn section<'a>(doc: &'a str, title: &str) -> Option<&'a str> {
    let start = doc.lines().position(|l| l.trim_end() == title)?;
    let body: Vec<&str> = doc.lines().skip(start + 1).collect();
    let end = body
        .iter()
        .position(|l| l.starts_with("## "))
        .unwrap_or(body.len());
    let (first, last) = (body.first()?, body[..end].last()?);
    let from = first.as_ptr() as usize - doc.as_ptr() as usize;
    let to = last.as_ptr() as usize - doc.as_ptr() as usize + last.len();
    Some(&doc[from..to])
}

/// The `###` subsections of `text` whose heading contains `needle`, concatenated.
fn subsections(text: &str, needle: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("### ") {
            inside = line.contains(needle);
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The names not written as `` `name` `` in `text`.
fn missing<'a>(text: &str, names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| !text.contains(&format!("`{n}`")))
        .cloned()
        .collect()
}

fn reference() -> &'static str {
    section(README, SECTION).unwrap_or_else(|| panic!("README.md has no {SECTION:?} section"))
}

// --- the command line ---------------------------------------------------------------------

/// The subcommands `gpushare help` lists (the binary's own clap definition, `Cli` being
/// private to it).
fn subcommands() -> Vec<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpushare"))
        .arg("help")
        .output()
        .expect("run gpushare help");
    let text = String::from_utf8(out.stdout).expect("utf-8 help");
    let mut names = Vec::new();
    let mut listing = false;
    for line in text.lines() {
        if line.starts_with("Commands:") {
            listing = true;
            continue;
        }
        if listing {
            let Some(name) = line.split_whitespace().next() else {
                break;
            };
            if !line.starts_with(' ') {
                break;
            }
            if name != "help" {
                names.push(name.to_string());
            }
        }
    }
    assert!(
        !names.is_empty(),
        "no subcommands in `gpushare help`:\n{text}"
    );
    names
}

/// The long flags of a subcommand's clap arguments (without `--help`).
fn long_flags<A: clap::Args>() -> BTreeSet<String> {
    let cmd = A::augment_args(clap::Command::new("x"));
    cmd.get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| *l != "help" && *l != "version")
        .map(|l| format!("--{l}"))
        .collect()
}

/// Each subcommand's flags, from its clap `Args`. `runtime` takes runc's arguments, all
/// passed through; `hook` takes only its stage.
fn flags_of(sub: &str) -> Option<BTreeSet<String>> {
    Some(match sub {
        "node" | "capacity" => long_flags::<cmd::node::NodeArgs>(),
        "guardian" => long_flags::<cmd::guardian::GuardianArgs>(),
        "simulate" => long_flags::<cmd::simulate::SimulateArgs>(),
        "inspect" => long_flags::<cmd::inspect::InspectArgs>(),
        "scheduler" => long_flags::<cmd::scheduler::SchedulerArgs>(),
        "run" => long_flags::<cmd::run::RunArgs>(),
        "runtime" | "hook" => BTreeSet::new(),
        _ => return None,
    })
}

// --- the checks ---------------------------------------------------------------------------

fn node_keys() -> BTreeSet<String> {
    let value = serde_json::to_value(NodeConfig::default()).expect("serialize the defaults");
    let mut paths = serialized_paths(&value);
    paths.extend(traced_paths::<NodeConfig>().expect("trace NodeConfig"));
    leaves(&paths)
}

#[test]
fn every_node_config_key_is_in_the_reference() {
    let keys = node_keys();
    assert!(
        keys.len() > 40,
        "the walkers found only {} keys: {keys:?}",
        keys.len()
    );
    for expected in [
        "throttle.period_ms",
        "throttle.context_allowance_mib",
        "sim.gpu.uuid",
        "log.file",
        "runtime_api.runc_roots",
    ] {
        assert!(keys.contains(expected), "walkers missed {expected}");
    }
    let text = subsections(reference(), "node.toml");
    let gone = missing(&text, &keys);
    assert!(
        gone.is_empty(),
        "README.md {SECTION}, subsection on node.toml, lacks these node config keys: {}",
        gone.join(", ")
    );
}

#[test]
fn every_runtime_config_key_is_in_the_reference() {
    let keys = leaves(&traced_paths::<ClientConfig>().expect("trace ClientConfig"));
    assert_eq!(keys.len(), 4, "{keys:?}");
    let text = subsections(reference(), "runtime.toml");
    let gone = missing(&text, &keys);
    assert!(
        gone.is_empty(),
        "README.md {SECTION}, subsection on runtime.toml, lacks these keys: {}",
        gone.join(", ")
    );
}

#[test]
fn every_flag_of_every_subcommand_is_in_the_reference() {
    let mut gone = Vec::new();
    for sub in subcommands() {
        let heading = format!("`gpushare {sub}`");
        let text = subsections(reference(), &heading);
        if text.is_empty() {
            gone.push(format!("a ### subsection naming {heading}"));
            continue;
        }
        let Some(flags) = flags_of(&sub) else {
            gone.push(format!(
                "{heading}: unknown to this test; add its clap Args to flags_of"
            ));
            continue;
        };
        gone.extend(
            missing(&text, &flags)
                .into_iter()
                .map(|f| format!("{heading} {f}")),
        );
    }
    assert!(
        gone.is_empty(),
        "README.md {SECTION} lacks: {}",
        gone.join(", ")
    );
}

// --- the checks check -----------------------------------------------------------------------

#[derive(serde::Serialize, serde::Deserialize, Default)]
#[serde(default)]
struct Small {
    enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit_mib: Option<u64>,
    inner: Inner,
    entries: Vec<Entry>,
}

#[derive(serde::Serialize, serde::Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct Inner {
    period_ms: u64,
    path: Option<std::path::PathBuf>,
    mode: Mode,
}

#[derive(serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum Mode {
    #[default]
    Hard,
    Burst,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    index: u32,
    name: String,
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_walkers_find_every_key_and_a_missing_one_is_reported() {
    let all = set(&[
        "enabled",
        "limit_mib",
        "inner.period-ms",
        "inner.path",
        "inner.mode",
        "entries.index",
        "entries.name",
    ]);
    let traced = leaves(&traced_paths::<Small>().unwrap());
    assert_eq!(traced, all);
    // Serializing the defaults misses the skipped `None` and the empty list's entries: why
    // the tracer is there.
    let serialized = leaves(&serialized_paths(
        &serde_json::to_value(Small::default()).unwrap(),
    ));
    assert_eq!(
        serialized,
        set(&[
            "enabled",
            "inner.period-ms",
            "inner.path",
            "inner.mode",
            "entries"
        ])
    );
    let doc = "# x\n## Configuration reference\n### `small.toml`\n\
               | `enabled` | `limit_mib` | `inner.period-ms` | `inner.path` |\n\
               | `entries.index` | `entries.name` |\n\
               ### `gpushare other`\n`inner.mode`\n## Next\n`inner.mode`\n";
    let text = subsections(section(doc, SECTION).unwrap(), "small.toml");
    assert_eq!(missing(&text, &all), vec!["inner.mode".to_string()]);
    assert_eq!(section(doc, "## Next").unwrap(), "`inner.mode`");
}

#[test]
fn a_missing_flag_is_reported() {
    let flags = long_flags::<cmd::guardian::GuardianArgs>();
    assert_eq!(
        flags,
        set(&["--leave-cgroup", "--list", "--now", "--watch"])
    );
    assert_eq!(
        missing("### `gpushare guardian`\n`--list`\n", &flags),
        vec![
            "--leave-cgroup".to_string(),
            "--now".to_string(),
            "--watch".to_string()
        ]
    );
}

//! Reading JSON that came from outside (annotations, the limits file) with errors that help:
//! a parse into a plain tree ([`Json`]) that keeps every key of an object, duplicates
//! included, and typed readers that name the field path (`containers.main[0].corePercent`),
//! the value (cut, [`Echo`]) and what was expected.
//!
//! Two kinds of failure stay apart: [`Malformed`] (not JSON at all: serde_json's syntax error,
//! which never quotes the input) and [`SchemaError`] (JSON, but not what the field takes).
//!
//! Numbers: serde_json hands integers that fit 64 bits over as integers and everything else
//! (a fraction, an exponent, an integer too large for 64 bits) as `f64`. An `f64` with a
//! fractional part, or a whole one within the 64-bit range (`30.0`, `3e1`), was written as a
//! non-integer; a whole one outside it is an integer out of range (`1e20`,
//! `99999999999999999999`).

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::echo::{Echo, cut_message};

/// A parsed JSON value; objects keep their entries in order, duplicates included.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    /// A non-negative integer.
    U64(u64),
    /// A negative integer.
    I64(i64),
    /// Anything else serde_json reads as a number (see the module documentation).
    F64(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

/// Not JSON: serde_json's syntax error (`expected value at line 1 column 1`), cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses `raw` into a [`Json`] tree (nesting is bounded by serde_json's recursion limit).
pub fn parse(raw: &str) -> Result<Json, Malformed> {
    serde_json::from_str::<Json>(raw).map_err(|e| Malformed(cut_message(&e.to_string(), 160)))
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(if v >= 0 {
            Json::U64(v as u64)
        } else {
            Json::I64(v)
        })
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::U64(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::F64(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        Json::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Json>()? {
            out.push(v);
        }
        Ok(Json::Arr(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        // serde_json's own map type keeps the last of duplicate keys; this keeps them all, so
        // that a reader can refuse them.
        let mut out = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value::<Json>()?;
            out.push((k, v));
        }
        Ok(Json::Obj(out))
    }
}

impl Json {
    /// What the value is, for "is …, expected …" (a string is shown cut).
    pub fn describe(&self) -> String {
        match self {
            Json::Null => "null".into(),
            Json::Bool(b) => b.to_string(),
            Json::U64(v) => v.to_string(),
            Json::I64(v) => v.to_string(),
            Json::F64(v) => show_f64(*v),
            Json::Str(s) => format!("the string {}", Echo::new(s)),
            Json::Arr(_) => "an array".into(),
            Json::Obj(_) => "an object".into(),
        }
    }
}

/// A float, short (`30.0`, `1e20`, `-0.5`).
fn show_f64(v: f64) -> String {
    format!("{v:?}")
}

/// Where a value sits in the document: `containers.main[0].corePercent`; `""` is the root.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Path(String);

impl Path {
    pub fn root() -> Path {
        Path(String::new())
    }

    /// A field of a fixed schema (a name of ours).
    pub fn field(&self, name: &str) -> Path {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    /// A key chosen by the writer (a container name): `.main`, or `["odd key…" (N bytes)]`
    /// when it is not a plain name or is long.
    pub fn key(&self, key: &str) -> Path {
        let plain = !key.is_empty()
            && key.len() <= 64
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if plain {
            self.field(key)
        } else {
            Path(format!("{}[{}]", self.0, Echo::new(key)))
        }
    }

    pub fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What is wrong with a value of a well-formed document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// `is the string "1": expected an integer in [0, 4294967295]`
    WrongType { found: String, expected: String },
    /// `30.0 is not an integer: expected …`
    NotInteger { value: String, expected: String },
    /// `-2048 is out of range: expected an integer in [1, …]`
    OutOfRange { value: String, expected: String },
    /// `has no memoryMiB: expected …`
    Missing {
        field: &'static str,
        expected: String,
    },
    /// `has an unknown field "gpu" (known: …)`
    Unknown { field: Echo, known: String },
    /// `has the key "main" twice`
    Duplicate { key: Echo },
    /// `"yesterday" is not an RFC 3339 date-time …`
    Invalid { value: Echo, expected: String },
    /// `lists 65 entries, at most 64`
    TooMany { count: usize, max: usize },
}

/// A field of a well-formed document that is not what the schema takes, with its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    pub path: Path,
    pub problem: Problem,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The owner writes its name first ("gpushare.io/assignment "), then this.
        if !self.path.is_root() {
            write!(f, "{} ", self.path)?;
        }
        match &self.problem {
            Problem::WrongType { found, expected } => write!(f, "is {found}: expected {expected}"),
            Problem::NotInteger { value, expected } => {
                write!(f, "{value} is not an integer: expected {expected}")
            }
            Problem::OutOfRange { value, expected } => {
                write!(f, "{value} is out of range: expected {expected}")
            }
            Problem::Missing { field, expected } => {
                write!(f, "has no {field}: expected {expected}")
            }
            Problem::Unknown { field, known } => {
                write!(f, "has an unknown field {field} (known: {known})")
            }
            Problem::Duplicate { key } => write!(f, "has the key {key} twice"),
            Problem::Invalid { value, expected } => write!(f, "{value} is not {expected}"),
            Problem::TooMany { count, max } => write!(f, "lists {count} entries, at most {max}"),
        }
    }
}

impl SchemaError {
    pub fn new(path: &Path, problem: Problem) -> SchemaError {
        SchemaError {
            path: path.clone(),
            problem,
        }
    }

    fn wrong_type(path: &Path, v: &Json, expected: &str) -> SchemaError {
        SchemaError::new(
            path,
            Problem::WrongType {
                found: v.describe(),
                expected: expected.to_string(),
            },
        )
    }
}

/// An object of the document, its keys checked to be unique.
#[derive(Debug, Clone, Copy)]
pub struct Object<'a> {
    pub entries: &'a [(String, Json)],
}

/// Reads an object; a key given twice is an error naming it.
pub fn object<'a>(v: &'a Json, path: &Path, expected: &str) -> Result<Object<'a>, SchemaError> {
    let Json::Obj(entries) = v else {
        return Err(SchemaError::wrong_type(path, v, expected));
    };
    let mut seen = HashSet::with_capacity(entries.len());
    for (k, _) in entries {
        if !seen.insert(k.as_str()) {
            return Err(SchemaError::new(
                path,
                Problem::Duplicate { key: Echo::new(k) },
            ));
        }
    }
    Ok(Object { entries })
}

impl<'a> Object<'a> {
    pub fn get(&self, key: &str) -> Option<&'a Json> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A field that must be present.
    pub fn required(
        &self,
        path: &Path,
        key: &'static str,
        expected: &str,
    ) -> Result<&'a Json, SchemaError> {
        self.get(key).ok_or_else(|| {
            SchemaError::new(
                path,
                Problem::Missing {
                    field: key,
                    expected: expected.to_string(),
                },
            )
        })
    }

    /// A field that must be present and be an integer in `[lo, hi]`; `expected` says so in
    /// the error (missing, wrong type or out of range).
    pub fn integer_field(
        &self,
        path: &Path,
        key: &'static str,
        lo: i128,
        hi: i128,
        expected: &str,
    ) -> Result<i128, SchemaError> {
        integer_as(
            self.required(path, key, expected)?,
            &path.field(key),
            lo,
            hi,
            expected,
        )
    }

    /// The `version` field of a versioned document; the caller compares it with the version
    /// it knows, so that each document names its own error.
    pub fn version(&self, path: &Path) -> Result<u32, SchemaError> {
        Ok(self.integer_field(path, "version", 0, u32::MAX.into(), "the integer 1")? as u32)
    }

    /// Refuses any key not in `known` (a typo must not silently drop a quota).
    pub fn deny_unknown(&self, path: &Path, known: &[&str]) -> Result<(), SchemaError> {
        match self
            .entries
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            None => Ok(()),
            Some((k, _)) => Err(SchemaError::new(
                path,
                Problem::Unknown {
                    field: Echo::new(k),
                    known: known.join(", "),
                },
            )),
        }
    }
}

/// Reads an array.
pub fn array<'a>(v: &'a Json, path: &Path, expected: &str) -> Result<&'a [Json], SchemaError> {
    match v {
        Json::Arr(items) => Ok(items),
        _ => Err(SchemaError::wrong_type(path, v, expected)),
    }
}

/// Reads a string.
pub fn string<'a>(v: &'a Json, path: &Path, expected: &str) -> Result<&'a str, SchemaError> {
    match v {
        Json::Str(s) => Ok(s),
        _ => Err(SchemaError::wrong_type(path, v, expected)),
    }
}

/// Reads a boolean.
pub fn boolean(v: &Json, path: &Path) -> Result<bool, SchemaError> {
    match v {
        Json::Bool(b) => Ok(*b),
        _ => Err(SchemaError::wrong_type(path, v, "true or false")),
    }
}

/// Reads an integer in `[lo, hi]` (`i128` holds every `u64` and `i64`).
pub fn integer(v: &Json, path: &Path, lo: i128, hi: i128) -> Result<i128, SchemaError> {
    let expected = format!("an integer in [{lo}, {hi}]");
    integer_as(v, path, lo, hi, &expected)
}

/// Like [`integer`], with `expected` saying more than the range.
pub fn integer_as(
    v: &Json,
    path: &Path,
    lo: i128,
    hi: i128,
    expected: &str,
) -> Result<i128, SchemaError> {
    let n = match *v {
        Json::U64(n) => i128::from(n),
        Json::I64(n) => i128::from(n),
        Json::F64(f) => {
            // Whole and beyond 64 bits: an integer out of range; else not an integer.
            let whole = f.fract() == 0.0;
            let beyond = !(-9_223_372_036_854_775_808.0..18_446_744_073_709_551_616.0).contains(&f);
            let value = show_f64(f);
            let expected = expected.to_string();
            return Err(SchemaError::new(
                path,
                if whole && beyond {
                    Problem::OutOfRange { value, expected }
                } else {
                    Problem::NotInteger { value, expected }
                },
            ));
        }
        _ => return Err(SchemaError::wrong_type(path, v, expected)),
    };
    if n < lo || n > hi {
        return Err(SchemaError::new(
            path,
            Problem::OutOfRange {
                value: n.to_string(),
                expected: expected.to_string(),
            },
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_duplicate_keys_and_tells_numbers_apart() {
        let v =
            parse(r#"{"a":1,"a":-2,"b":[30.0,1e20,99999999999999999999,null,true,"x"]}"#).unwrap();
        let Json::Obj(entries) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[1], ("a".to_string(), Json::I64(-2)));
        let e = object(&v, &Path::root(), "an object").unwrap_err();
        assert_eq!(e.to_string(), "has the key \"a\" twice");
        let Json::Arr(b) = &entries[2].1 else {
            panic!()
        };
        let p = Path::root().field("b");
        let msgs: Vec<String> = b
            .iter()
            .map(|x| integer(x, &p, 0, 10).unwrap_err().to_string())
            .collect();
        assert_eq!(
            msgs,
            [
                "b 30.0 is not an integer: expected an integer in [0, 10]",
                "b 1e20 is out of range: expected an integer in [0, 10]",
                "b 1e20 is out of range: expected an integer in [0, 10]",
                "b is null: expected an integer in [0, 10]",
                "b is true: expected an integer in [0, 10]",
                "b is the string \"x\": expected an integer in [0, 10]",
            ]
        );
    }

    #[test]
    fn paths_quote_odd_keys_and_cut_long_ones() {
        let p = Path::root().field("containers");
        assert_eq!(p.key("main").index(0).to_string(), "containers.main[0]");
        assert_eq!(p.key("a.b").to_string(), "containers[\"a.b\"]");
        let long = "x".repeat(1 << 20);
        let shown = p.key(&long).to_string();
        assert!(
            shown.len() < 100 && shown.contains("(1048576 bytes)"),
            "{shown}"
        );
    }

    #[test]
    fn malformed_is_not_a_schema_error_and_is_short() {
        let e = parse("{\"a\":").unwrap_err();
        assert!(e.0.starts_with("EOF while parsing"), "{e}");
        let deep = "[".repeat(100_000);
        let e = parse(&deep).unwrap_err();
        assert!(e.0.contains("recursion limit"), "{e}");
    }
}

//! A small hand-rolled fuzzer (stable toolchain, no dependencies): a seeded PRNG, input
//! generators (random bytes, token soup, structure-aware JSON mutations of valid inputs,
//! byte-level mutations), and a loop that runs a target on each input and checks the
//! properties every target shares:
//!
//! - it never panics (panics are caught per input; a target's own assertions count too);
//! - no input takes longer than [`HANG`] of CPU time (the thread's, so that other builds on
//!   the machine do not count; an input over it is run twice more, and counts as a hang only
//!   when every run was over);
//! - every rejection message is non-empty, at most [`MAX_MESSAGE`] characters, and contains
//!   one of the target's markers (it names a field, or says what was malformed).
//!
//! Failing inputs are written to `tests/fuzz-corpus/<target>/crash-<hash>` (replayed by the
//! `fuzz_corpus_replays_clean` test from then on). `GPUSHARE_FUZZ_CASES` sets the inputs per
//! target (default [`DEFAULT_CASES`]), `GPUSHARE_FUZZ_SEED` the seed (default fixed).

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Once;
use std::time::Duration;

use serde_json::Value;

/// Inputs per target when `GPUSHARE_FUZZ_CASES` is not set: quick enough for `cargo test`.
pub const DEFAULT_CASES: u64 = 5_000;
/// No single input may take longer.
pub const HANG: Duration = Duration::from_millis(100);
/// Longest rejection message allowed.
pub const MAX_MESSAGE: usize = 512;

/// What one input did: the messages of the rejections it met (each checked), and whether the
/// target accepted it.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rejections: Vec<String>,
    /// The target's parser accepted the input (what it fed was then exercised).
    pub accepted: bool,
}

impl Outcome {
    pub fn reject(&mut self, msg: impl ToString) {
        self.rejections.push(msg.to_string());
    }
}

/// What a target does with one input.
pub type RunFn<'a> = Box<dyn FnMut(&[u8]) -> Outcome + 'a>;

/// A fuzz target.
pub struct Target<'a> {
    pub name: &'static str,
    /// Valid inputs to mutate (the corpus directory's files are added).
    pub seeds: Vec<Vec<u8>>,
    /// Words for the structure-aware mutator (the schema's field names).
    pub dict: &'static [&'static str],
    /// A rejection message must contain one of these.
    pub markers: &'static [&'static str],
    /// Whether inputs are JSON (structure-aware JSON mutations) or binary.
    pub json: bool,
    pub run: RunFn<'a>,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub target: &'static str,
    pub inputs: u64,
    pub panics: u64,
    pub hangs: u64,
    pub bad_messages: u64,
    pub rejections: u64,
    pub accepted: u64,
    pub distinct: HashSet<String>,
    /// The first few failures, for the test's message.
    pub failures: Vec<String>,
    /// Failures met (the first [`KEEP_MAX`] are written to the corpus).
    pub kept: u64,
    pub slowest: Duration,
}

impl Report {
    pub fn summary(&self) -> String {
        format!(
            "target {}: {} inputs, {} panics, {} hangs, {} distinct rejections ({} bad messages; {} inputs accepted by the parser, {} met a rejection; slowest {:.1} ms)",
            self.target,
            self.inputs,
            self.panics,
            self.hangs,
            self.distinct.len(),
            self.bad_messages,
            self.accepted,
            self.rejections,
            self.slowest.as_secs_f64() * 1e3
        )
    }

    pub fn clean(&self) -> bool {
        self.panics == 0 && self.hangs == 0 && self.bad_messages == 0
    }
}

pub fn cases() -> u64 {
    std::env::var("GPUSHARE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Largest input generated (`GPUSHARE_FUZZ_MAX_INPUT`, bytes): 256 KiB by default, the most a
/// Kubernetes object's annotations may take, so that the short debug-build run stays quick;
/// `make fuzz` raises it past the extender's 2 MiB body limit.
pub fn max_input() -> usize {
    std::env::var("GPUSHARE_FUZZ_MAX_INPUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 10)
}

pub fn seed() -> u64 {
    std::env::var("GPUSHARE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6770_7573_6861_7265)
}

/// SplitMix64: small, fast, good enough to drive a fuzzer; reproducible from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// FNV-1a, for crash file names and the corpus.
pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz-corpus")
        .join(target)
}

/// The corpus files of `target` (seeds and kept failures), sorted by name.
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let Ok(dir) = std::fs::read_dir(corpus_dir(target)) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = dir
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            std::fs::read(e.path()).ok().map(|d| (name, d))
        })
        .collect();
    out.sort();
    out
}

thread_local! {
    /// While set, a panic's message is kept here instead of printed.
    static CAUGHT: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

fn quiet_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let kept = CAUGHT.with(|c| {
                let mut c = c.borrow_mut();
                match c.as_mut() {
                    Some(slot) => {
                        let msg = info
                            .payload()
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| info.payload().downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        let at = info
                            .location()
                            .map(|l| format!(" at {}:{}", l.file(), l.line()))
                            .unwrap_or_default();
                        *slot = Some(format!("{msg}{at}"));
                        true
                    }
                    None => false,
                }
            });
            if !kept {
                default(info);
            }
        }));
    });
}

/// CPU time of the calling thread: unlike the wall clock, not stretched when other builds
/// share the machine's cores.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_THREAD_CPUTIME_ID exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs the target once on `input`: `Err(panic message)` or the outcome and how long it took
/// (CPU time of this thread).
fn run_once(
    run: &mut (dyn FnMut(&[u8]) -> Outcome + '_),
    input: &[u8],
) -> (Result<Outcome, String>, Duration) {
    quiet_panics();
    CAUGHT.with(|c| *c.borrow_mut() = Some(None));
    let t = thread_cpu_time();
    let r = catch_unwind(AssertUnwindSafe(|| run(input)));
    let took = thread_cpu_time().saturating_sub(t);
    let msg = CAUGHT.with(|c| c.borrow_mut().take()).flatten();
    (r.map_err(|_| msg.unwrap_or_else(|| "panic".into())), took)
}

/// Checks one rejection message: non-empty, short, names a field or says what was malformed.
pub fn check_message(msg: &str, markers: &[&str]) -> Result<(), String> {
    let chars = msg.chars().count();
    if msg.trim().is_empty() {
        return Err("empty message".into());
    }
    if chars > MAX_MESSAGE {
        return Err(format!(
            "message of {chars} characters: {}",
            msg.chars().take(200).collect::<String>()
        ));
    }
    if !markers.iter().any(|m| msg.contains(m)) {
        return Err(format!(
            "message names no field (none of {markers:?}): {msg}"
        ));
    }
    Ok(())
}

/// The shape of a message, for counting distinct rejections: quoted text and numbers
/// replaced, so "gpuIndex 7 …" and "gpuIndex 9 …" are one kind.
pub fn shape(msg: &str) -> String {
    let mut out = String::new();
    let mut in_quote = false;
    let mut escaped = false;
    let mut prev_digit = false;
    for c in msg.chars() {
        if in_quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_quote = false;
                out.push('"');
            }
            continue;
        }
        if c == '"' {
            in_quote = true;
            out.push_str("\"…");
            prev_digit = false;
            continue;
        }
        if c.is_ascii_digit() {
            if !prev_digit {
                out.push('#');
            }
            prev_digit = true;
            continue;
        }
        prev_digit = false;
        out.push(c);
    }
    out
}

/// Runs one input and records what it did in `report`: `Err(why)` when it failed, else
/// whether the target's parser accepted it.
pub fn exercise(
    target: &mut Target<'_>,
    report: &mut Report,
    input: &[u8],
) -> Result<bool, String> {
    report.inputs += 1;
    let (r, mut took) = run_once(&mut *target.run, input);
    let outcome = match r {
        Err(panic) => {
            report.panics += 1;
            return Err(format!("panic: {panic}"));
        }
        Ok(o) => o,
    };
    if took > HANG {
        // Confirm: the machine may simply have been busy.
        for _ in 0..2 {
            let (_, t) = run_once(&mut *target.run, input);
            took = took.min(t);
        }
        if took > HANG {
            report.hangs += 1;
            return Err(format!("hang: {:.1} ms", took.as_secs_f64() * 1e3));
        }
    }
    report.slowest = report.slowest.max(took);
    if !outcome.rejections.is_empty() {
        report.rejections += 1;
    }
    if outcome.accepted {
        report.accepted += 1;
    }
    for msg in &outcome.rejections {
        if let Err(why) = check_message(msg, target.markers) {
            report.bad_messages += 1;
            return Err(why);
        }
        if report.distinct.len() < 100_000 {
            report.distinct.insert(shape(msg));
        }
    }
    Ok(outcome.accepted)
}

/// Failures kept per run (a bug found once tends to be found thousands of times).
const KEEP_MAX: usize = 20;

fn keep_failure(target: &str, input: &[u8], why: &str, report: &mut Report) {
    report.kept += 1;
    if report.kept > KEEP_MAX as u64 {
        return;
    }
    let dir = corpus_dir(target);
    let path = dir.join(format!("crash-{:016x}", fnv(input)));
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(&path, input);
    if report.failures.len() < 5 {
        let shown: String = String::from_utf8_lossy(input).chars().take(300).collect();
        report.failures.push(format!(
            "{why}\n    input ({} bytes, kept as {}): {shown}",
            input.len(),
            path.display()
        ));
    }
}

/// Runs `cases` generated inputs through the target.
pub fn fuzz(target: &mut Target<'_>, cases: u64, seed: u64) -> Report {
    let mut rng = Rng::new(seed ^ fnv(target.name.as_bytes()));
    let mut seeds: Vec<Vec<u8>> = target.seeds.clone();
    seeds.extend(corpus(target.name).into_iter().map(|(_, d)| d));
    if seeds.is_empty() {
        seeds.push(b"{}".to_vec());
    }
    // Mutations of mutations reach deeper: inputs the parser accepted (which lead past it)
    // and, fewer, inputs it refused; the seeds stay.
    let mut accepted_pool: Vec<Vec<u8>> = Vec::new();
    let mut refused_pool: Vec<Vec<u8>> = Vec::new();
    let mut report = Report {
        target: target.name,
        ..Default::default()
    };
    let max = max_input();
    for _ in 0..cases {
        let base = match rng.below(10) {
            0..=3 => rng.pick(&seeds),
            4..=7 if !accepted_pool.is_empty() => rng.pick(&accepted_pool),
            _ if !refused_pool.is_empty() => rng.pick(&refused_pool),
            _ => rng.pick(&seeds),
        }
        .clone();
        let splice = if rng.one_in(2) || accepted_pool.is_empty() {
            &seeds
        } else {
            &accepted_pool
        };
        let mut input = generate(&mut rng, &base, splice, target.dict, target.json);
        input.truncate(max);
        let (keep, pool) = match exercise(target, &mut report, &input) {
            Err(why) => {
                keep_failure(target.name, &input, &why, &mut report);
                continue;
            }
            Ok(true) => (rng.one_in(2), &mut accepted_pool),
            Ok(false) => (rng.one_in(32), &mut refused_pool),
        };
        if keep && input.len() < 4096 {
            if pool.len() < 256 {
                pool.push(input);
            } else {
                let i = rng.below(256);
                pool[i] = input;
            }
        }
    }
    report
}

/// One input: random bytes, token soup, a structure-aware JSON mutation of `base` or a
/// byte-level mutation of it (splicing from `pool`).
pub fn generate(
    rng: &mut Rng,
    base: &[u8],
    pool: &[Vec<u8>],
    dict: &[&str],
    json: bool,
) -> Vec<u8> {
    let base = base.to_vec();
    match rng.below(10) {
        0 => random_bytes(rng),
        1 if json => token_soup(rng, dict),
        2..=7 if json => match serde_json::from_slice::<Value>(&base) {
            Ok(mut v) => {
                // Gentle (the field keeps its type, the document stays close to valid and
                // reaches past the parser) or hostile (wrong types, bounds, odd keys).
                let gentle = rng.one_in(2);
                for _ in 0..1 + rng.below(3) {
                    if gentle {
                        nudge_value(rng, &mut v, dict, 0);
                    } else {
                        mutate_value(rng, &mut v, dict, 0);
                    }
                }
                let mut out = String::new();
                write_json(&v, &mut out);
                if rng.one_in(6) {
                    mutate_bytes(rng, out.into_bytes(), pool)
                } else {
                    out.into_bytes()
                }
            }
            Err(_) => mutate_bytes(rng, base, pool),
        },
        _ => mutate_bytes(rng, base, pool),
    }
}

pub fn random_bytes(rng: &mut Rng) -> Vec<u8> {
    let len = if rng.one_in(20) {
        rng.below(8192)
    } else {
        rng.below(64)
    };
    (0..len).map(|_| rng.next() as u8).collect()
}

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "\"\"",
    "null",
    "true",
    "false",
    "0",
    "1",
    "-1",
    "5",
    "30",
    "100",
    "1e20",
    "30.0",
    "-0",
    "99999999999999999999",
    " ",
    "\n",
    "\\",
    "\\u0000",
    "\\ud800",
    "é",
    "😀",
    "\u{202e}",
];

fn token_soup(rng: &mut Rng, dict: &[&str]) -> Vec<u8> {
    let mut out = String::new();
    for _ in 0..rng.below(40) {
        if rng.one_in(3) && !dict.is_empty() {
            out.push('"');
            let word = rng.pick::<&str>(dict);
            out.push_str(word);
            out.push('"');
        } else {
            let token = rng.pick::<&str>(TOKENS);
            out.push_str(token);
        }
    }
    out.into_bytes()
}

/// A JSON literal written as is (numbers serde_json cannot hold, deep nesting, bad escapes):
/// a string value starting with this marker.
const RAW: &str = "\u{1}RAW\u{1}";

fn raw(text: impl Into<String>) -> Value {
    Value::String(format!("{RAW}{}", text.into()))
}

/// Numbers near every boundary the schemas have.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "4",
    "5",
    "33",
    "64",
    "65",
    "100",
    "101",
    "105",
    "1023",
    "1024",
    "15360",
    "20480",
    "255",
    "256",
    "4294967295",
    "4294967296",
    "4294967297",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "17592186044415",
    "17592186044416",
    "17179869183",
    "17179869184",
    "18014398509481984",
    "99999999999999999999",
    "-99999999999999999999",
    "1e20",
    "1E5",
    "30.0",
    "3e1",
    "0.5",
    "-0",
    "-0.0",
    "1e308",
    "1e400",
    "-1e400",
    "4194314",
    "4194315",
    "2147483648",
];

fn long_string(rng: &mut Rng) -> String {
    let c = *rng.pick(&['a', 'é', '😀', '\0', '"', '\\', '\u{202e}', '\n', ' ']);
    let n = match rng.below(200) {
        // 1 MiB of a character JSON writes as is (escaped ones would make 6 MiB).
        0 if c == 'a' => 1 << 20,
        0..=8 => 65_536,
        9..=60 => 65 + rng.below(300),
        _ => rng.below(70),
    };
    std::iter::repeat_n(c, n).collect()
}

/// Strings worth trying where a string goes (and where a number goes, as strings).
fn interesting_string(rng: &mut Rng, dict: &[&str]) -> String {
    match rng.below(14) {
        0 => String::new(),
        1 => " 2".into(),
        2 => "2 ".into(),
        3 => "\t30".into(),
        4 => rng.pick(NUMBERS).to_string(),
        5 => format!(" {} ", rng.pick(NUMBERS)),
        6 => "2026-11-29T19:00:00Z".into(),
        7 => rng
            .pick(&[
                "2026-13-01T00:00:00Z",
                "2026-02-29T00:00:00Z",
                "2024-02-29T23:59:60.5+05:30",
                "2026-11-29 19:00:00Z",
                "2026-11-29T19:00:00",
                "2026-11-29t19:00:00z",
                "9999-12-31T23:59:59.999999999-23:59",
            ])
            .to_string(),
        8 => "GPU-00000000-0000-4000-8000-000000000001".into(),
        9 if !dict.is_empty() => rng.pick(dict).to_string(),
        10 => "\u{202e}\u{0}😀é".into(),
        11 => "2GiB".into(),
        _ => long_string(rng),
    }
}

fn deep(rng: &mut Rng) -> Value {
    let n = *rng.pick(&[10usize, 100, 127, 128, 129, 1000, 100_000]);
    if rng.one_in(2) {
        raw(format!("{}{}", "[".repeat(n), "]".repeat(n)))
    } else {
        raw(format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n)))
    }
}

/// A value of a random kind, often the wrong one for the field.
fn interesting_value(rng: &mut Rng, dict: &[&str]) -> Value {
    match rng.below(12) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2..=4 => raw(*rng.pick(NUMBERS)),
        5..=7 => Value::String(interesting_string(rng, dict)),
        8 => Value::Array(Vec::new()),
        9 => Value::Object(Default::default()),
        10 => deep(rng),
        _ => raw(*rng.pick(&[
            "\"\\ud800\"",
            "\"\\u0000\"",
            "\"a\\u0022b\"",
            "\"\\x\"",
            "\"tab\there\"",
            "NaN",
            "Infinity",
            "01",
            "+1",
            ".5",
        ])),
    }
}

/// Changes `v` somewhere: a value replaced by another kind, a key dropped, added, renamed or
/// given twice (see [`write_json`]), an array grown past the schema's bounds or emptied.
pub fn mutate_value(rng: &mut Rng, v: &mut Value, dict: &[&str], depth: usize) {
    let descend = depth < 12 && rng.below(3) != 0;
    match v {
        Value::Object(map) if descend && !map.is_empty() => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let k = rng.pick(&keys).clone();
            if let Some(child) = map.get_mut(&k) {
                mutate_value(rng, child, dict, depth + 1);
            }
            return;
        }
        Value::Array(items) if descend && !items.is_empty() => {
            let i = rng.below(items.len());
            mutate_value(rng, &mut items[i], dict, depth + 1);
            return;
        }
        _ => {}
    }
    match v {
        Value::Object(map) => match rng.below(6) {
            0 if !map.is_empty() => {
                let keys: Vec<String> = map.keys().cloned().collect();
                map.remove(rng.pick(&keys));
            }
            1 if !map.is_empty() => {
                // Renamed: a schema word, a long key, an odd key.
                let keys: Vec<String> = map.keys().cloned().collect();
                let old = rng.pick(&keys).clone();
                if let Some(val) = map.remove(&old) {
                    let new = if rng.one_in(2) && !dict.is_empty() {
                        rng.pick(dict).to_string()
                    } else {
                        interesting_string(rng, dict)
                    };
                    map.insert(new, val);
                }
            }
            2 if !map.is_empty() => {
                // Given twice: written twice by `write_json`.
                let keys: Vec<String> = map.keys().cloned().collect();
                let k = rng.pick(&keys).clone();
                if let Some(val) = map.remove(&k) {
                    map.insert(format!("{DUP}{k}"), val);
                }
            }
            3 if !dict.is_empty() => {
                let k = rng.pick(dict).to_string();
                map.insert(k, interesting_value(rng, dict));
            }
            4 => {
                map.insert(interesting_string(rng, dict), interesting_value(rng, dict));
            }
            _ => *v = interesting_value(rng, dict),
        },
        Value::Array(items) => match rng.below(5) {
            0 if !items.is_empty() => {
                // Past the bounds: 64 GPUs, 16 limits, many containers.
                let n = *rng.pick(&[2usize, 16, 17, 63, 64, 65, 200]);
                let first = items[0].clone();
                items.resize(n, first);
            }
            1 if !items.is_empty() => {
                items.remove(rng.below(items.len()));
            }
            2 => items.push(interesting_value(rng, dict)),
            3 => items.clear(),
            _ => *v = interesting_value(rng, dict),
        },
        _ => *v = interesting_value(rng, dict),
    }
}

/// Numbers a well-formed document would carry.
const GENTLE_NUMBERS: &[&str] = &[
    "0", "1", "2", "3", "4", "5", "7", "10", "15", "20", "25", "30", "40", "50", "60", "64", "65",
    "95", "100", "105", "512", "1024", "2048", "4096", "8192", "15360", "16384",
];

/// Changes one leaf to another value of its kind (a number, a string, a flag), or an array's
/// length, or drops an object key: documents stay close to valid, so that what the parser
/// feeds is exercised too.
pub fn nudge_value(rng: &mut Rng, v: &mut Value, dict: &[&str], depth: usize) {
    match v {
        Value::Object(map) if !map.is_empty() && depth < 16 => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let k = rng.pick(&keys).clone();
            if rng.one_in(8) {
                map.remove(&k);
            } else if let Some(child) = map.get_mut(&k) {
                nudge_value(rng, child, dict, depth + 1);
            }
        }
        Value::Array(items) if !items.is_empty() && depth < 16 => match rng.below(6) {
            0 => {
                let i = rng.below(items.len());
                let copy = items[i].clone();
                items.push(copy);
            }
            1 => {
                items.remove(rng.below(items.len()));
            }
            _ => {
                let i = rng.below(items.len());
                nudge_value(rng, &mut items[i], dict, depth + 1);
            }
        },
        Value::Number(_) => *v = raw(*rng.pick(GENTLE_NUMBERS)),
        Value::String(s) if s.starts_with(RAW) => *v = raw(*rng.pick(GENTLE_NUMBERS)),
        Value::String(_) => {
            *v = Value::String(match rng.below(4) {
                0 if !dict.is_empty() => rng.pick(dict).to_string(),
                1 => rng.pick(GENTLE_NUMBERS).to_string(),
                _ => interesting_string(rng, dict),
            })
        }
        Value::Bool(b) => *b = !*b,
        _ => {}
    }
}

/// A key written twice (the value once, then again with a `1` changed).
const DUP: &str = "\u{1}DUP\u{1}";

/// Writes `v` as JSON, honouring [`RAW`] literals and [`DUP`] keys.
pub fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => match s.strip_prefix(RAW) {
            Some(lit) => out.push_str(lit),
            None => out.push_str(&serde_json::to_string(s).expect("string")),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            let mut first = true;
            for (k, val) in map {
                let (k, twice) = match k.strip_prefix(DUP) {
                    Some(k) => (k, true),
                    None => (k.as_str(), false),
                };
                for _ in 0..1 + usize::from(twice) {
                    if !first {
                        out.push(',');
                    }
                    first = false;
                    out.push_str(&serde_json::to_string(k).expect("key"));
                    out.push(':');
                    write_json(val, out);
                }
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Byte-level: flips, inserts, deletes, truncation, duplicated runs, splices.
pub fn mutate_bytes(rng: &mut Rng, mut data: Vec<u8>, pool: &[Vec<u8>]) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let len = data.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(len + 1);
                let t = rng.pick(TOKENS).as_bytes().to_vec();
                data.splice(i..i, t);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = rng.below(len - i + 1).min(32);
                data.drain(i..i + n);
            }
            4 if len > 0 => data.truncate(rng.below(len)),
            5 if len > 0 => {
                let i = rng.below(len);
                let n = rng.below(len - i).min(64) + 1;
                let run = data[i..i + n].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, run);
            }
            6 => {
                let other = rng.pick(pool);
                if !other.is_empty() {
                    let cut = rng.below(other.len());
                    let at = rng.below(len + 1);
                    data.truncate(at);
                    data.extend_from_slice(&other[cut..]);
                }
            }
            _ => {
                let i = rng.below(len + 1);
                let n = *rng.pick(&[1usize, 100, 4096]);
                data.splice(i..i, std::iter::repeat_n(rng.next() as u8, n));
            }
        }
    }
    data
}

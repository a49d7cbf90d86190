//! How an error message shows a value that came from outside (a pod's annotation or limits, a
//! node's annotation, a request body): whole when it is short, else a short prefix and its
//! length, so that a 1 MiB annotation makes a refusal of a hundred bytes, not of two
//! megabytes. Every error that echoes an outside value holds an [`Echo`] of it, made where the
//! error is made.
//!
//! - `{}` shows it quoted and escaped: `"two"`, `"aaaa…" (1048576 bytes)`;
//! - `{:#}` shows it bare (for names in running text): `ns/p`, `aaaa… (1048576 bytes)`.
//!
//! Control and other non-printable characters are escaped either way (`\n`, `\u{202e}`); the
//! prefix is at most [`ECHO_MAX`] characters *after* escaping, so a value made of NULs is cut
//! as short as any other.

use std::fmt;

/// Most characters of an echoed value shown (after escaping).
pub const ECHO_MAX: usize = 64;

/// An outside value as an error message shows it (see the module documentation). Holds the
/// shown prefix only (and the whole length): small enough for error enums.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Echo {
    /// The part of the value shown: all of it, or a prefix cut on a character boundary.
    shown: Box<str>,
    /// Length of the whole value in bytes.
    len: usize,
}

impl Echo {
    /// Keeps at most [`ECHO_MAX`] characters of `raw`.
    pub fn new(raw: &str) -> Echo {
        Echo::with_limit(raw, ECHO_MAX)
    }

    /// Keeps at most `max` characters of `raw` (after escaping, in either form).
    pub fn with_limit(raw: &str, max: usize) -> Echo {
        let cut = fits(raw, max, true).min(fits(raw, max, false));
        Echo {
            shown: raw[..cut].into(),
            len: raw.len(),
        }
    }

    /// Whether the message shows only a prefix of the value.
    pub fn is_cut(&self) -> bool {
        self.shown.len() < self.len
    }

    /// Length of the whole value in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl From<&str> for Echo {
    fn from(raw: &str) -> Echo {
        Echo::new(raw)
    }
}

impl From<&String> for Echo {
    fn from(raw: &String) -> Echo {
        Echo::new(raw)
    }
}

impl fmt::Display for Echo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quoted = !f.alternate();
        let ellipsis = if self.is_cut() { "…" } else { "" };
        if quoted {
            f.write_str("\"")?;
        }
        for c in self.shown.chars() {
            write_escaped(f, c, quoted)?;
        }
        f.write_str(ellipsis)?;
        if quoted {
            f.write_str("\"")?;
        }
        if self.is_cut() {
            write!(f, " ({} bytes)", self.len)?;
        }
        Ok(())
    }
}

/// A message (a library's error text, which may itself quote outside input) cut to at most
/// `max` characters, shown bare: `…` and the whole length when cut.
pub fn cut_message(msg: &str, max: usize) -> String {
    format!("{:#}", Echo::with_limit(msg, max))
}

/// Whether a character is shown as is: `'` always, `"` and `\\` in the bare form; others are
/// escaped like `{:?}` escapes them (control and non-printable characters, and in the quoted
/// form `"` and `\\`).
fn plain(c: char, quoted: bool) -> bool {
    c == '\'' || (!quoted && (c == '"' || c == '\\'))
}

fn write_escaped(f: &mut fmt::Formatter<'_>, c: char, quoted: bool) -> fmt::Result {
    if plain(c, quoted) {
        write!(f, "{c}")
    } else {
        write!(f, "{}", c.escape_debug())
    }
}

/// How many bytes of `raw` fit in `max` characters once escaped.
fn fits(raw: &str, max: usize, quoted: bool) -> usize {
    let mut chars = 0;
    for (at, c) in raw.char_indices() {
        let n = if plain(c, quoted) {
            1
        } else {
            c.escape_debug().count()
        };
        if chars + n > max {
            return at;
        }
        chars += n;
    }
    raw.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_whole_long_values_cut_with_their_length() {
        assert_eq!(Echo::new("two").to_string(), "\"two\"");
        assert_eq!(format!("{:#}", Echo::new("ns/p")), "ns/p");
        assert_eq!(Echo::new("").to_string(), "\"\"");
        let exact = "a".repeat(ECHO_MAX);
        assert_eq!(Echo::new(&exact).to_string(), format!("\"{exact}\""));
        let big = "a".repeat(1 << 20);
        let e = Echo::new(&big);
        assert!(e.is_cut());
        assert_eq!(
            e.to_string(),
            format!("\"{}…\" (1048576 bytes)", "a".repeat(ECHO_MAX))
        );
        assert_eq!(
            format!("{e:#}"),
            format!("{}… (1048576 bytes)", "a".repeat(ECHO_MAX))
        );
    }

    #[test]
    fn escapes_count_against_the_limit_and_cut_on_char_boundaries() {
        assert_eq!(Echo::new("a\"b\n").to_string(), r#""a\"b\n""#);
        assert_eq!(format!("{:#}", Echo::new("a\"b\n")), "a\"b\\n");
        let nuls = "\0".repeat(1000);
        let shown = Echo::new(&nuls).to_string();
        assert!(shown.len() < 100, "{shown}");
        assert!(shown.ends_with("(1000 bytes)"), "{shown}");
        // Multi-byte characters are never split.
        let s = "é".repeat(100);
        let shown = Echo::new(&s).to_string();
        assert!(
            shown.starts_with(&format!("\"{}…\"", "é".repeat(ECHO_MAX))),
            "{shown}"
        );
        // Bidi controls are shown escaped.
        assert_eq!(Echo::new("\u{202e}x").to_string(), "\"\\u{202e}x\"");
    }

    #[test]
    fn messages_are_cut_bare() {
        assert_eq!(cut_message("short", 10), "short");
        assert_eq!(cut_message("0123456789abc", 10), "0123456789… (13 bytes)");
    }
}

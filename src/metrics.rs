//! One writer of the Prometheus text exposition format (version 0.0.4) for the node agent's
//! status endpoint and the scheduler extender: `# HELP` and `# TYPE` lines, samples with
//! escaped label values. It writes what it is told in the order it is told (a sample may be
//! written without a `# TYPE` line, as the endpoints always have).

use std::fmt::{self, Display, Write as _};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        })
    }
}

/// Builds one exposition.
#[derive(Debug, Default)]
pub struct PromText {
    out: String,
    /// The family [`PromText::sample`] writes to.
    current: String,
}

impl PromText {
    pub fn new() -> Self {
        PromText::default()
    }

    /// `# HELP name text`.
    pub fn help(&mut self, name: &str, text: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {text}");
        self
    }

    /// `# TYPE name kind`; later [`PromText::sample`]s belong to `name`.
    pub fn family(&mut self, name: &str, kind: Kind) -> &mut Self {
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self.untyped(name)
    }

    /// Later [`PromText::sample`]s belong to `name`, with no `# TYPE` line.
    pub fn untyped(&mut self, name: &str) -> &mut Self {
        self.current.clear();
        self.current.push_str(name);
        self
    }

    /// A sample of the current family.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Display) -> &mut Self {
        let name = std::mem::take(&mut self.current);
        self.sample_of(&name, labels, value);
        self.current = name;
        self
    }

    /// A sample named `name` (a histogram's `_bucket`, `_sum`, `_count`, or a series written
    /// among another family's).
    pub fn sample_of(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl Display,
    ) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape_into(&mut self.out, v);
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A label value as the text format wants it: `\`, `"` and newlines escaped.
fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_text_format() {
        let mut m = PromText::new();
        m.help("a_total", "things done")
            .family("a_total", Kind::Counter)
            .sample(&[("result", "ok")], 3)
            .sample(&[("result", "failed"), ("why", "say \"no\"\\\n")], 0)
            .untyped("b")
            .sample(&[], 1.5)
            .family("h", Kind::Histogram)
            .sample_of("h_bucket", &[("le", "+Inf")], 2)
            .sample(&[], format!("{:.4}", 0.25));
        assert_eq!(
            m.finish(),
            "# HELP a_total things done\n\
             # TYPE a_total counter\n\
             a_total{result=\"ok\"} 3\n\
             a_total{result=\"failed\",why=\"say \\\"no\\\"\\\\\\n\"} 0\n\
             b 1.5\n\
             # TYPE h histogram\n\
             h_bucket{le=\"+Inf\"} 2\n\
             h 0.2500\n"
        );
    }
}

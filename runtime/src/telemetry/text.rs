//! Reading Prometheus text back: the CLI reads a running worker's `/metrics` with it, tests
//! read a worker's figures. Only what the exposition format needs for samples (names, label
//! sets with escapes, values); comments are skipped.

use std::collections::BTreeMap;

use serde::Serialize;

/// One sample line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricSample {
    /// The metric (for histograms: `…_bucket`, `…_sum`, `…_count`).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Samples parsed from Prometheus text.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MetricSet {
    /// In the order they appeared.
    pub samples: Vec<MetricSample>,
}

impl MetricSet {
    /// Parses exposition text; lines that are not samples are skipped.
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(parse_sample)
            .collect();
        Self { samples }
    }

    /// The sum of `name`'s samples whose labels include every `(label, value)` in `labels`;
    /// 0 when there is none (a counter never incremented is not rendered).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        // Starting from +0.0: an empty f64 sum is -0.0, which prints oddly.
        self.matching(name, labels)
            .fold(0.0, |sum, s| sum + s.value)
    }

    /// `name`'s samples whose labels include every pair in `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a MetricSample> + 'a {
        self.samples.iter().filter(move |sample| {
            sample.name == name
                && labels
                    .iter()
                    .all(|(k, v)| sample.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

fn parse_sample(line: &str) -> Option<MetricSample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(at) => line.split_at(at),
        None => return None,
    };
    if name.is_empty() {
        return None;
    }
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inside) => parse_labels(inside)?,
        None => (BTreeMap::new(), rest),
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    Some(MetricSample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `k="v",…}` and returns the labels and what follows the closing brace.
fn parse_labels(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, rest) = text.split_once('=')?;
        let (value, rest) = parse_quoted(rest.strip_prefix('"')?)?;
        labels.insert(key.trim().to_owned(), value);
        text = rest;
    }
}

/// Reads an escaped label value up to its closing quote.
fn parse_quoted(text: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((value, &text[at + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            other => value.push(other),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_escaped_labels_and_histogram_lines_are_read() {
        let text = "# HELP x_total Things.\n# TYPE x_total counter\n\
                    x_total{effect=\"re\\\"book\",kind=\"a\"} 3\n\
                    x_total{effect=\"notify\",kind=\"a\"} 2\n\
                    y 1.5\n\
                    z_bucket{le=\"+Inf\"} 4\n";
        let set = MetricSet::parse(text);
        assert_eq!(set.samples.len(), 4);
        assert_eq!(set.value("x_total", &[("effect", "re\"book")]), 3.0);
        assert_eq!(set.value("x_total", &[("kind", "a")]), 5.0);
        assert_eq!(set.value("y", &[]), 1.5);
        assert_eq!(set.value("z_bucket", &[("le", "+Inf")]), 4.0);
        assert_eq!(set.value("absent", &[]), 0.0);
    }

    #[test]
    fn lines_that_are_not_samples_are_skipped() {
        let set = MetricSet::parse("garbage\nx{unterminated=\"v 1\n{} 2\nok 7\n");
        assert_eq!(set.samples.len(), 1);
        assert_eq!(set.value("ok", &[]), 7.0);
    }
}

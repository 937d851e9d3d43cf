//! `waymark stats`: the replay-safety figures of a running worker (its `/metrics`, parsed) or of
//! a stopped worker's data dir (read from its journals and operation log), as a table or JSON.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use waymark::telemetry::{JournalStats, MetricSet};

/// What `stats` found, from either source.
pub(crate) struct Stats {
    /// `worker` or `data_dir`.
    pub(crate) source: &'static str,
    /// Workflows by status.
    pub(crate) workflows: BTreeMap<String, u64>,
    /// Operations by status (data dir only: a worker reports them as metrics).
    pub(crate) operations: Option<BTreeMap<String, u64>>,
    /// Summed over every journal (data dir only).
    pub(crate) journals: Option<JournalStats>,
    /// The worker's metrics.
    pub(crate) metrics: Option<MetricSet>,
}

impl Stats {
    pub(crate) fn print(&self, as_json: bool) {
        if as_json {
            println!("{}", self.to_json());
        } else {
            print!("{}", crate::out::printable(&self.table()));
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "source": self.source,
            "workflows": self.workflows,
            "operations": self.operations,
            "journals": self.journals,
            "derived": self.derived(),
            "metrics": self.metrics.as_ref().map(|m| &m.samples),
        })
    }

    /// Ratios worth reading at a glance: calls made per call needed.
    fn derived(&self) -> BTreeMap<&'static str, f64> {
        let mut derived = BTreeMap::new();
        if let Some(journals) = self.journals.as_ref().filter(|j| j.ideal_calls > 0) {
            let ratio = journals.journaled_attempts as f64 / journals.ideal_calls as f64;
            derived.insert("journaled_attempts_per_call", ratio);
        }
        if let Some(metrics) = &self.metrics {
            let ended = metrics.value("waymark_retry_amplification_count", &[]);
            if ended > 0.0 {
                let sum = metrics.value("waymark_retry_amplification_sum", &[]);
                derived.insert("mean_retry_amplification", sum / ended);
            }
        }
        derived
    }

    fn table(&self) -> String {
        let mut out = String::new();
        section(&mut out, "workflows", self.workflows.iter().map(count_row));
        if let Some(operations) = &self.operations {
            section(&mut out, "operations", operations.iter().map(count_row));
        }
        if let Some(journals) = &self.journals {
            section(&mut out, "journals", journal_rows(journals));
        }
        let derived = self.derived();
        let derived = derived
            .iter()
            .map(|(k, v)| (k.to_string(), format!("{v:.3}")));
        section(&mut out, "derived", derived);
        if let Some(metrics) = &self.metrics {
            section(&mut out, "metrics", metric_rows(metrics));
        }
        out
    }
}

fn count_row((name, count): (&String, &u64)) -> (String, String) {
    (name.clone(), count.to_string())
}

fn section(out: &mut String, title: &str, rows: impl Iterator<Item = (String, String)>) {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return;
    }
    out.push_str(title);
    out.push('\n');
    for (name, value) in rows {
        out.push_str(&format!("  {name:<64} {value:>12}\n"));
    }
}

/// Every field of the journal figures, validator depths one row per depth.
fn journal_rows(journals: &JournalStats) -> impl Iterator<Item = (String, String)> {
    let Ok(Value::Object(fields)) = serde_json::to_value(journals) else {
        return Vec::new().into_iter();
    };
    let mut rows = Vec::new();
    for (name, value) in fields {
        match value {
            Value::Object(depths) => {
                for (depth, count) in depths {
                    rows.push((format!("{name}[{depth}]"), count.to_string()));
                }
            }
            other => rows.push((name, other.to_string())),
        }
    }
    rows.into_iter()
}

/// The `waymark_` samples; histogram buckets are left to the JSON (sum and count stay).
fn metric_rows(metrics: &MetricSet) -> impl Iterator<Item = (String, String)> + '_ {
    metrics
        .samples
        .iter()
        .filter(|s| s.name.starts_with("waymark_") && !s.name.ends_with("_bucket"))
        // A worker of an older build rendered a histogram without buckets as a summary.
        .filter(|s| !s.labels.contains_key("quantile"))
        .map(|s| {
            let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let name = match labels.is_empty() {
                true => s.name.clone(),
                false => format!("{}{{{}}}", s.name, labels.join(",")),
            };
            (name, format_value(s.value))
        })
}

fn format_value(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value:.3}")
    }
}

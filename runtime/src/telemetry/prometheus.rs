//! The worker's own recorder, rendered as Prometheus text.
//!
//! Counters and gauges are atomics. A histogram counts each value into its bucket as it is
//! recorded, so a render reads every figure as it stands and nothing waits to be drained. No
//! figure reads a clock. The exporter crate this replaces stamped every histogram value with
//! `quanta`'s clock, whose calibration spins a core at each process start until its readings
//! settle: 0.6 ms on an idle machine, 5 to 20 ms in three of twelve restarts on a busy one,
//! and the first figure recorded waited for it (13 ms in one of those).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::iter::Peekable;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_util::registry::{Registry, Storage};

use super::names::{RECOVERY_LATENCY, RETRY_AMPLIFICATION, VALIDATOR_DEPTH};
use crate::sync::lock;

/// Seconds a workflow took to run again after a start or an event.
const LATENCY_BOUNDS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0];
/// Rungs of a repair ladder.
const DEPTH_BOUNDS: &[f64] = &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 8.0];
/// Invocations per completed workflow over the ideal.
const AMPLIFICATION_BOUNDS: &[f64] = &[1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0];
/// Prometheus's own default, for a histogram named nowhere above.
const DEFAULT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The upper bounds of `histogram`'s buckets, ascending, for the histograms the worker names.
fn bounds_of(histogram: &str) -> Option<&'static [f64]> {
    match histogram {
        RECOVERY_LATENCY => Some(LATENCY_BOUNDS),
        VALIDATOR_DEPTH => Some(DEPTH_BOUNDS),
        RETRY_AMPLIFICATION => Some(AMPLIFICATION_BOUNDS),
        _ => None,
    }
}

/// A recorder whose figures [`PrometheusRecorder::render`] writes out.
pub(super) struct PrometheusRecorder {
    registry: Registry<Key, Figures>,
    /// Each metric's `# HELP` text, by name: the first description given.
    descriptions: Mutex<HashMap<String, SharedString>>,
}

impl PrometheusRecorder {
    pub(super) fn new() -> Self {
        Self {
            registry: Registry::new(Figures),
            descriptions: Mutex::default(),
        }
    }

    fn describe(&self, name: KeyName, description: SharedString) {
        lock(&self.descriptions)
            .entry(name.as_str().to_owned())
            .or_insert(description);
    }

    /// Every figure in the text exposition format: the metrics by name, each with its `# HELP`
    /// (when described) and `# TYPE` lines, then its series ordered by labels.
    pub(super) fn render(&self) -> String {
        let descriptions = lock(&self.descriptions);
        let mut out = String::new();
        let counters = sorted(self.registry.get_counter_handles());
        let gauges = sorted(self.registry.get_gauge_handles());
        let histograms = sorted(self.registry.get_histogram_handles());
        let mut families = Vec::new();
        families.extend(names(&counters).map(|name| (name.to_owned(), Kind::Counter)));
        families.extend(names(&gauges).map(|name| (name.to_owned(), Kind::Gauge)));
        families.extend(names(&histograms).map(|name| (name.to_owned(), Kind::Histogram)));
        families.sort();
        let mut counters = counters.into_iter().peekable();
        let mut gauges = gauges.into_iter().peekable();
        let mut histograms = histograms.into_iter().peekable();
        for (name, kind) in families {
            if let Some(description) = descriptions.get(&name) {
                let _ = writeln!(out, "# HELP {name} {}", escape_help(description));
            }
            let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
            match kind {
                Kind::Counter => {
                    for (key, counter) in family(&mut counters, &name) {
                        let value = counter.load(Ordering::Relaxed);
                        write_series(&mut out, &name, "", &key, None, &value.to_string());
                    }
                }
                Kind::Gauge => {
                    for (key, gauge) in family(&mut gauges, &name) {
                        let value = f64::from_bits(gauge.load(Ordering::Relaxed));
                        write_series(&mut out, &name, "", &key, None, &float(value));
                    }
                }
                Kind::Histogram => {
                    for (key, buckets) in family(&mut histograms, &name) {
                        buckets.write(&mut out, &name, &key);
                    }
                }
            }
        }
        out
    }
}

impl Recorder for PrometheusRecorder {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let counter = |counter: &Arc<AtomicU64>| Counter::from_arc(counter.clone());
        self.registry.get_or_create_counter(key, counter)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let gauge = |gauge: &Arc<AtomicU64>| Gauge::from_arc(gauge.clone());
        self.registry.get_or_create_gauge(key, gauge)
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let histogram = |buckets: &Arc<Buckets>| Histogram::from_arc(buckets.clone());
        self.registry.get_or_create_histogram(key, histogram)
    }
}

/// What the registry keeps per key: a count, a gauge's `f64` bits, a histogram's buckets.
struct Figures;

impl Storage<Key> for Figures {
    type Counter = Arc<AtomicU64>;
    type Gauge = Arc<AtomicU64>;
    type Histogram = Arc<Buckets>;

    fn counter(&self, _: &Key) -> Self::Counter {
        Arc::default()
    }

    fn gauge(&self, _: &Key) -> Self::Gauge {
        // The bits of 0.0.
        Arc::default()
    }

    fn histogram(&self, key: &Key) -> Self::Histogram {
        let bounds = bounds_of(key.name()).unwrap_or(DEFAULT_BOUNDS);
        Arc::new(Buckets::new(bounds))
    }
}

/// A histogram's figures: how many values fell in each bucket (not cumulative: the last counts
/// those above every bound) and their sum.
pub(super) struct Buckets {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    /// The sum's `f64` bits.
    sum: AtomicU64,
}

impl Buckets {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    /// The `_bucket` series (cumulative, as Prometheus reads them), `_sum` and `_count`. The
    /// count is the last bucket's, so the two agree in every render; a value recorded while
    /// this writes may be counted and not yet summed, or the other way round.
    fn write(&self, out: &mut String, name: &str, key: &Key) {
        let mut cumulative = 0;
        for (index, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let bound = self.bounds.get(index).copied().unwrap_or(f64::INFINITY);
            let le = Some(float(bound));
            write_series(out, name, "_bucket", key, le, &cumulative.to_string());
        }
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed));
        write_series(out, name, "_sum", key, None, &float(sum));
        write_series(out, name, "_count", key, None, &cumulative.to_string());
    }
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        // The first bucket whose bound the value does not pass; NaN passes every bound, as in
        // Prometheus's own clients.
        let index = self.bounds.iter().position(|bound| value <= *bound);
        let index = index.unwrap_or(self.bounds.len());
        // Relaxed: no reader relies on an order between two figures.
        self.counts[index].fetch_add(1, Ordering::Relaxed);
        let add = |sum: u64| Some((f64::from_bits(sum) + value).to_bits());
        // `fetch_update` retries until no other record came in between; the closure never
        // refuses, so the result is always `Ok`.
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, add);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Handles ordered by metric name, then by labels.
fn sorted<T>(handles: impl IntoIterator<Item = (Key, T)>) -> Vec<(Key, T)> {
    let mut handles: Vec<(Key, T)> = handles.into_iter().collect();
    handles.sort_by(|(a, _), (b, _)| {
        let by_labels = || label_pairs(a).cmp(label_pairs(b));
        a.name().cmp(b.name()).then_with(by_labels)
    });
    handles
}

fn label_pairs(key: &Key) -> impl Iterator<Item = (&str, &str)> {
    key.labels().map(|label| (label.key(), label.value()))
}

/// The distinct names of sorted handles.
fn names<T>(handles: &[(Key, T)]) -> impl Iterator<Item = &str> {
    let mut previous = None;
    handles.iter().filter_map(move |(key, _)| {
        let name = key.name();
        let new = previous != Some(name);
        previous = Some(name);
        new.then_some(name)
    })
}

/// The handles named `name`, taken from the front of `handles`: the families are written in
/// name order, the order `handles` is sorted in, so a family's handles are the first left.
fn family<'h, T>(
    handles: &'h mut Peekable<std::vec::IntoIter<(Key, T)>>,
    name: &'h str,
) -> impl Iterator<Item = (Key, T)> + 'h {
    std::iter::from_fn(move || handles.next_if(|(key, _)| key.name() == name))
}

/// One sample line: `name{labels} value`, with `le` after the key's labels when given.
fn write_series(
    out: &mut String,
    name: &str,
    suffix: &str,
    key: &Key,
    le: Option<String>,
    value: &str,
) {
    out.push_str(name);
    out.push_str(suffix);
    let mut labels = key
        .labels()
        .map(|label| (label.key(), escape_label(label.value())))
        .collect::<Vec<_>>();
    if let Some(le) = le {
        labels.push(("le", le));
    }
    if !labels.is_empty() {
        let labels: Vec<String> = labels
            .iter()
            .map(|(key, value)| format!("{key}=\"{value}\""))
            .collect();
        let _ = write!(out, "{{{}}}", labels.join(","));
    }
    let _ = writeln!(out, " {value}");
}

/// A float as the exposition format spells it.
fn float(value: f64) -> String {
    match value {
        f64::INFINITY => "+Inf".to_owned(),
        f64::NEG_INFINITY => "-Inf".to_owned(),
        value if value.is_nan() => "NaN".to_owned(),
        value => value.to_string(),
    }
}

/// A label value with its backslashes, quotes and line breaks escaped.
fn escape_label(value: &str) -> String {
    escape(value, true)
}

/// A `# HELP` text with its backslashes and line breaks escaped (quotes stay as they are).
fn escape_help(value: &str) -> String {
    escape(value, false)
}

fn escape(value: &str, quotes: bool) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '\n' => escaped.push_str("\\n"),
            '"' if quotes => escaped.push_str("\\\""),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use metrics::{counter, describe_counter, gauge, histogram};

    use super::*;
    use crate::sync::lock;
    use crate::telemetry::MetricSet;

    fn recorded(record: impl FnOnce()) -> String {
        let recorder = PrometheusRecorder::new();
        metrics::with_local_recorder(&recorder, record);
        recorder.render()
    }

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket_and_every_later_one() {
        let text = recorded(|| {
            for value in [0.0, 1.0, 1.5, 8.0, 9.0, f64::NAN] {
                histogram!(VALIDATOR_DEPTH).record(value);
            }
        });
        let figures = MetricSet::parse(&text);
        let bucket = |le: &str| figures.value(&format!("{VALIDATOR_DEPTH}_bucket"), &[("le", le)]);
        assert_eq!(bucket("0"), 1.0, "{text}");
        assert_eq!(bucket("1"), 2.0, "{text}");
        assert_eq!(bucket("2"), 3.0, "{text}");
        assert_eq!(bucket("8"), 4.0, "{text}");
        assert_eq!(bucket("+Inf"), 6.0, "{text}");
        let count = figures.value(&format!("{VALIDATOR_DEPTH}_count"), &[]);
        assert_eq!(count, 6.0, "{text}");
        assert!(
            text.contains(&format!("{VALIDATOR_DEPTH}_sum NaN\n")),
            "{text}"
        );
    }

    #[test]
    fn a_histogram_sums_what_it_recorded() {
        let text = recorded(|| {
            histogram!(RECOVERY_LATENCY, "cause" => "event").record(0.25);
            histogram!(RECOVERY_LATENCY, "cause" => "event").record(0.5);
            histogram!(RECOVERY_LATENCY, "cause" => "worker_start").record(3.0);
        });
        let figures = MetricSet::parse(&text);
        let sum = |cause| figures.value(&format!("{RECOVERY_LATENCY}_sum"), &[("cause", cause)]);
        assert_eq!(sum("event"), 0.75, "{text}");
        assert_eq!(sum("worker_start"), 3.0, "{text}");
        let first_bucket = format!("{RECOVERY_LATENCY}_bucket{{cause=\"event\",le=\"0.001\"}} 0");
        assert!(text.contains(&first_bucket), "{text}");
    }

    #[test]
    fn each_metric_is_described_and_typed_once_before_its_series() {
        let text = recorded(|| {
            describe_counter!("b_total", "Bs \\ counted.\nTwice.");
            counter!("b_total", "x" => "2").increment(2);
            counter!("b_total", "x" => "1").increment(1);
            gauge!("a").set(0.5);
        });
        let expected = "# TYPE a gauge\na 0.5\n\
            # HELP b_total Bs \\\\ counted.\\nTwice.\n# TYPE b_total counter\n\
            b_total{x=\"1\"} 1\nb_total{x=\"2\"} 2\n";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_label_value_is_escaped_and_read_back_whole() {
        let value = "say \"hi\"\\\nthere";
        let text = recorded(|| counter!("calls_total", "effect" => value).increment(1));
        assert!(
            text.contains(r#"calls_total{effect="say \"hi\"\\\nthere"} 1"#),
            "{text}"
        );
        let figures = MetricSet::parse(&text);
        assert_eq!(figures.value("calls_total", &[("effect", value)]), 1.0);
    }

    #[test]
    fn values_recorded_from_many_threads_are_all_counted_and_summed() {
        let recorder = PrometheusRecorder::new();
        let key = Key::from_static_name(RETRY_AMPLIFICATION);
        let histogram = recorder.register_histogram(&key, &metadata());
        std::thread::scope(|threads| {
            for _ in 0..4 {
                threads.spawn(|| (0..10_000).for_each(|_| histogram.record(1.5)));
            }
        });
        let figures = MetricSet::parse(&recorder.render());
        let figure = |suffix: &str| figures.value(&format!("{RETRY_AMPLIFICATION}{suffix}"), &[]);
        assert_eq!(figure("_count"), 40_000.0);
        assert_eq!(figure("_sum"), 60_000.0);
    }

    /// The names the worker describes, each with the kind it is described as.
    #[derive(Default)]
    struct Described(std::sync::Mutex<Vec<(String, Kind)>>);

    impl Described {
        fn add(&self, name: KeyName, kind: Kind) {
            lock(&self.0).push((name.as_str().to_owned(), kind));
        }
    }

    impl Recorder for Described {
        fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(key, Kind::Counter);
        }
        fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(key, Kind::Gauge);
        }
        fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(key, Kind::Histogram);
        }
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    /// A name under two kinds, or a histogram's series named like another metric, would render
    /// two `# TYPE` lines for one name, which Prometheus refuses; a histogram left to the
    /// default bounds would measure seconds whatever it counts.
    #[test]
    fn every_metric_has_one_name_and_every_histogram_its_own_bounds() {
        let described = Described::default();
        metrics::with_local_recorder(&described, crate::telemetry::names::describe_all);
        let described = described.0.into_inner().unwrap();
        let mut series = std::collections::HashSet::new();
        for (name, kind) in &described {
            let suffixes: &[&str] = match kind {
                Kind::Histogram => &["", "_bucket", "_sum", "_count"],
                _ => &[""],
            };
            for suffix in suffixes {
                assert!(
                    series.insert(format!("{name}{suffix}")),
                    "{name}{suffix} twice"
                );
            }
            if *kind == Kind::Histogram {
                let bounds = bounds_of(name).unwrap_or_else(|| panic!("{name} has no bounds"));
                assert!(bounds.windows(2).all(|pair| pair[0] < pair[1]), "{name}");
            }
        }
        assert!(described.iter().any(|(_, kind)| *kind == Kind::Histogram));
    }

    fn metadata() -> Metadata<'static> {
        Metadata::new(module_path!(), metrics::Level::INFO, None)
    }

    #[test]
    fn a_counter_set_absolute_never_goes_back() {
        let text = recorded(|| {
            counter!("writes_total").absolute(7);
            counter!("writes_total").absolute(5);
            gauge!("ratio").set(f64::INFINITY);
        });
        assert!(text.contains("writes_total 7\n"), "{text}");
        assert!(text.contains("ratio +Inf\n"), "{text}");
    }
}

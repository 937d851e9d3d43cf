//! The replay-safety figures as small bar charts, drawn on the server as SVG from the same
//! Prometheus text `/metrics` serves: no script, nothing fetched.

use maud::{html, Markup};
use waymark_runtime::telemetry::names;

/// The families the metrics page draws, each with its title.
pub(crate) const CHARTED: [(&str, &str); 4] = [
    (
        names::RETRY_AMPLIFICATION,
        "Retry amplification (mean of calls made / calls needed, per workflow)",
    ),
    (
        names::DUPLICATE_INTENTS,
        "Duplicate intents (an effect asked for again)",
    ),
    (names::UNKNOWN_OUTCOMES, "Unknown outcomes"),
    (
        names::LLM_WASTED_COST,
        "Model spend lost to failures, by where (micro-units)",
    ),
];

/// One family: its series (labels as written, value).
pub(crate) struct Family {
    pub(crate) name: &'static str,
    pub(crate) title: &'static str,
    pub(crate) series: Vec<(String, f64)>,
}

/// The charted families found in Prometheus `text` (a family with no series is empty).
pub(crate) fn families(text: &str) -> Vec<Family> {
    CHARTED
        .iter()
        .map(|&(name, title)| Family {
            name,
            title,
            series: series_or_mean(text, name),
        })
        .collect()
}

/// A counter's or gauge's series; for a histogram, the mean of each series (`_sum / _count`).
fn series_or_mean(text: &str, name: &str) -> Vec<(String, f64)> {
    let plain = series(text, name);
    if !plain.is_empty() {
        return plain;
    }
    let counts = series(text, &format!("{name}_count"));
    let sums = series(text, &format!("{name}_sum"));
    sums.into_iter()
        .filter_map(|(labels, sum)| {
            let (_, count) = counts.iter().find(|(l, _)| *l == labels)?;
            (*count > 0.0).then(|| (labels, sum / count))
        })
        .collect()
}

fn series(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(labelled) => labelled.rsplit_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            Some((labels.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Bar height and gap, and the width the bars share.
const BAR: usize = 22;
const WIDTH: f64 = 560.0;
const LABEL_WIDTH: usize = 260;

/// A family as horizontal bars with their labels and values, readable without colour.
pub(crate) fn chart(family: &Family) -> Markup {
    if family.series.is_empty() {
        return html! { p.muted { "Nothing counted yet." } };
    }
    let largest = family
        .series
        .iter()
        .map(|(_, v)| *v)
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let height = family.series.len() * (BAR + 6) + 6;
    let total = LABEL_WIDTH as f64 + WIDTH + 90.0;
    html! {
        svg.chart role="img" aria-label=(family.title) viewBox=(format!("0 0 {total} {height}"))
            width=(total) height=(height) xmlns="http://www.w3.org/2000/svg" {
            @for (row, (labels, value)) in family.series.iter().enumerate() {
                @let y = row * (BAR + 6) + 6;
                @let width = (value / largest * WIDTH).max(1.0);
                text x="0" y=(y + BAR - 6) class="label" { (shown_labels(labels)) }
                rect x=(LABEL_WIDTH) y=(y) width=(format!("{width:.1}")) height=(BAR) class="bar" {}
                text x=(format!("{:.1}", LABEL_WIDTH as f64 + width + 6.0)) y=(y + BAR - 6) class="value" {
                    (shown_value(*value))
                }
            }
        }
    }
}

fn shown_labels(labels: &str) -> String {
    match labels {
        "" => "all".to_owned(),
        labels => labels.replace('"', ""),
    }
}

fn shown_value(value: f64) -> String {
    match value.fract() == 0.0 && value.abs() < 1e15 {
        true => format!("{value:.0}"),
        false => format!("{value:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_read_with_and_without_labels() {
        let text = "# HELP x\nwaymark_unknown_outcomes_total 3\n\
                    waymark_llm_wasted_cost_micros_total{failed_at=\"plan\",stage=\"validator\"} 12.5\n";
        let found = families(text);
        let unknown = found
            .iter()
            .find(|f| f.name == names::UNKNOWN_OUTCOMES)
            .unwrap();
        assert_eq!(unknown.series, vec![(String::new(), 3.0)]);
        let wasted = found
            .iter()
            .find(|f| f.name == names::LLM_WASTED_COST)
            .unwrap();
        assert_eq!(wasted.series[0].1, 12.5);
        let histogram = "waymark_retry_amplification_bucket{le=\"1\"} 2\n\
                         waymark_retry_amplification_sum 5\nwaymark_retry_amplification_count 2\n";
        let amplification = &families(histogram)[0];
        assert_eq!(amplification.series, vec![(String::new(), 2.5)]);
        assert!(chart(wasted)
            .into_string()
            .contains("failed_at=plan,stage=validator"));
    }
}

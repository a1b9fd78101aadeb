//! A chart as an inline SVG line plot of its last hour.
//!
//! The console's Content-Security-Policy allows no inline styles, so the
//! look comes from presentation attributes (`stroke`, `fill`, …) that the
//! stylesheet may override through the classes: `chart`, `chart-title`,
//! `chart-unit`, `chart-axis`, `chart-label`, `chart-line line-N`,
//! `chart-legend line-N`, `chart-empty`.

use maud::{html, Markup};

use super::series::{Chart, HOUR_MS};

const WIDTH: f64 = 320.0;
const HEIGHT: f64 = 150.0;
const LEFT: f64 = 40.0;
const RIGHT: f64 = 312.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 118.0;
/// Lines beyond these take the colours again; the legend tells them apart.
const COLOURS: [&str; 3] = ["#2563eb", "#dc2626", "#059669"];

/// The chart's hour up to its newest point, or "no data yet" when no line
/// has a value.
pub fn chart(c: &Chart) -> Markup {
    let points = || c.lines.iter().flat_map(|l| l.points.iter());
    let end = points().map(|p| p.0).max();
    let top = points().filter_map(|p| p.1).reduce(f64::max);
    html! {
        svg.chart xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {WIDTH} {HEIGHT}"))
            role="img" aria-label=(c.title) font-family="sans-serif" {
            title { (c.title) " (" (c.unit) ")" }
            text.chart-title x="8" y="16" font-size="12" font-weight="bold" fill="currentColor" {
                (c.title)
            }
            text.chart-unit x=(RIGHT) y="16" font-size="10" text-anchor="end" fill="currentColor" {
                (c.unit)
            }
            @match (end, top) {
                (Some(end), Some(top)) => (plot(c, end, nice_ceiling(top))),
                _ => {
                    rect.chart-axis x=(LEFT) y=(TOP) width=(RIGHT - LEFT) height=(BOTTOM - TOP)
                        fill="none" stroke="#9ca3af" stroke-dasharray="3 3" {}
                    text.chart-empty x=((LEFT + RIGHT) / 2.0) y=((TOP + BOTTOM) / 2.0 + 4.0)
                        font-size="11" text-anchor="middle" fill="#6b7280" { "no data yet" }
                }
            }
        }
    }
}

fn plot(c: &Chart, end: i64, max: f64) -> Markup {
    let start = end - HOUR_MS;
    let x = |at: i64| LEFT + (at - start) as f64 / HOUR_MS as f64 * (RIGHT - LEFT);
    let y = |v: f64| BOTTOM - v / max * (BOTTOM - TOP);
    let label_y = BOTTOM + 13.0;
    html! {
        line.chart-axis x1=(LEFT) y1=(TOP) x2=(RIGHT) y2=(TOP)
            stroke="#d1d5db" stroke-dasharray="3 3" {}
        line.chart-axis x1=(LEFT) y1=(BOTTOM) x2=(RIGHT) y2=(BOTTOM) stroke="#9ca3af" {}
        text.chart-label x=(LEFT - 4.0) y=(TOP + 4.0) font-size="10" text-anchor="end"
            fill="currentColor" { (compact(max)) }
        text.chart-label x=(LEFT - 4.0) y=(BOTTOM + 4.0) font-size="10" text-anchor="end"
            fill="currentColor" { "0" }
        text.chart-label x=(LEFT) y=(label_y) font-size="10" fill="currentColor" { "−60 min" }
        text.chart-label x=((LEFT + RIGHT) / 2.0) y=(label_y) font-size="10" text-anchor="middle"
            fill="currentColor" { "−30 min" }
        text.chart-label x=(RIGHT) y=(label_y) font-size="10" text-anchor="end"
            fill="currentColor" { "now" }
        @for (i, line) in c.lines.iter().enumerate() {
            @let class = format!("chart-line line-{i}");
            @let colour = COLOURS[i % COLOURS.len()];
            @for run in runs(&line.points, start) {
                // A lone point is a dot: round caps draw a zero-length line.
                @let coords = run.iter().map(|&(at, v)| format!("{:.1},{:.1}", x(at), y(v)));
                @let coords = if run.len() == 1 {
                    coords.clone().chain(coords).collect::<Vec<_>>().join(" ")
                } else {
                    coords.collect::<Vec<_>>().join(" ")
                };
                polyline class=(class) points=(coords) fill="none" stroke=(colour)
                    stroke-width="1.5" stroke-linecap="round" stroke-linejoin="round" {}
            }
        }
        @if c.lines.len() > 1 {
            @for (i, line) in c.lines.iter().enumerate() {
                text class=(format!("chart-legend line-{i}"))
                    x=(LEFT + i as f64 * (RIGHT - LEFT) / c.lines.len() as f64) y=(HEIGHT - 4.0)
                    font-size="10" fill=(COLOURS[i % COLOURS.len()]) { "— " (line.name) }
            }
        }
    }
}

/// The unbroken stretches of values at or after `start`.
fn runs(points: &[(i64, Option<f64>)], start: i64) -> Vec<Vec<(i64, f64)>> {
    let mut runs = vec![];
    let mut run = vec![];
    for &(at, v) in points.iter().filter(|p| p.0 >= start) {
        match v {
            Some(v) if v.is_finite() => run.push((at, v)),
            _ if !run.is_empty() => runs.push(std::mem::take(&mut run)),
            _ => {}
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

/// The axis' top: 1, 2 or 5 times a power of ten, at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    if v.is_nan() || v <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&m| v <= m * (1.0 + 1e-9))
        .unwrap_or(10.0 * power)
}

/// A number in at most three significant digits: 0.00175, 2.5, 40, 1.5k, 2M.
pub fn compact(v: f64) -> String {
    let (v, suffix) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    if v == 0.0 || !v.is_finite() {
        return "0".to_owned();
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 9) as usize;
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    format!("{s}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::series::Line;

    fn one_line(points: Vec<(i64, Option<f64>)>) -> Chart {
        Chart {
            title: "Requests per second",
            unit: "req/s",
            lines: vec![Line {
                name: "requests",
                points,
            }],
        }
    }

    #[test]
    fn each_unbroken_run_is_one_polyline() {
        let t = |i: i64| 1_000_000 + i * 10_000;
        let c = one_line(vec![
            (t(0), Some(1.0)),
            (t(1), Some(2.0)),
            (t(2), None),
            (t(3), Some(3.0)),
            (t(4), None),
            (t(5), None),
            (t(6), Some(4.0)),
            (t(7), Some(4.5)),
            (t(8), Some(4.0)),
        ]);
        let svg = chart(&c).into_string();
        assert_eq!(svg.matches("<polyline").count(), 3, "{svg}");
        assert!(!svg.contains("no data yet"));
        // The top is rounded up to 5; the newest point is at the right edge.
        assert!(svg.contains(">5</text>"), "{svg}");
        assert!(svg.contains("312.0,46.0\""), "{svg}");
        // The lone point is drawn as a dot.
        let lone = format!(
            "{0:.1},{1:.1} {0:.1},{1:.1}",
            312.0 - 5.0 * 272.0 / 360.0,
            64.0
        );
        assert!(svg.contains(&lone), "{lone} in {svg}");
        assert!(svg.contains("−60 min") && svg.contains("now"));
        assert!(!svg.contains("style="), "{svg}");
    }

    #[test]
    fn lines_are_told_apart_and_text_is_escaped() {
        let c = Chart {
            title: "A <b>&</b> chart",
            unit: "\"ms\"",
            lines: vec![
                Line {
                    name: "p<50>",
                    points: vec![(0, Some(0.5)), (10_000, Some(0.75))],
                },
                Line {
                    name: "p99",
                    points: vec![(0, None), (10_000, Some(1.5))],
                },
            ],
        };
        let svg = chart(&c).into_string();
        assert!(!svg.contains("<b>") && !svg.contains("p<50>"), "{svg}");
        assert!(svg.contains("A &lt;b&gt;&amp;&lt;/b&gt; chart"), "{svg}");
        assert!(
            svg.contains("p&lt;50&gt;") && svg.contains("&quot;ms&quot;"),
            "{svg}"
        );
        assert!(svg.contains("class=\"chart-line line-0\""));
        assert!(svg.contains("class=\"chart-legend line-1\""));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">2</text>"), "{svg}");
        assert!(!svg.contains("style="), "{svg}");
    }

    #[test]
    fn a_chart_without_values_says_so() {
        for c in [
            one_line(vec![]),
            one_line(vec![(0, None), (10_000, None)]),
            Chart {
                title: "Nothing",
                unit: "ms",
                lines: vec![],
            },
        ] {
            let svg = chart(&c).into_string();
            assert!(svg.contains("no data yet"), "{svg}");
            assert!(
                !svg.contains("<polyline") && !svg.contains("style="),
                "{svg}"
            );
            assert!(svg.starts_with("<svg class=\"chart\""), "{svg}");
        }
        // Zeros are data: a flat line at the bottom of a 0-to-1 axis.
        let svg = chart(&one_line(vec![(0, Some(0.0)), (10_000, Some(0.0))])).into_string();
        assert!(
            !svg.contains("no data yet") && svg.contains(">1</text>"),
            "{svg}"
        );
    }

    #[test]
    fn numbers_are_compact_and_axes_round_up() {
        assert_eq!(compact(0.00175), "0.00175");
        assert_eq!(compact(2.5), "2.5");
        assert_eq!(compact(40.0), "40");
        assert_eq!(compact(1500.0), "1.5k");
        assert_eq!(compact(2_000_000.0), "2M");
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(1.0 / 3.0), "0.333");
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(compact(nice_ceiling(0.0031)), "0.005");
        assert_eq!(compact(nice_ceiling(2.0)), "2");
        assert_eq!(compact(nice_ceiling(2.1)), "5");
        assert_eq!(compact(nice_ceiling(7.0)), "10");
        assert_eq!(compact(nice_ceiling(1234.0)), "2k");
    }
}

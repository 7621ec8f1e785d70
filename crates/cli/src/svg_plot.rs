//! A small, self-contained SVG line chart: panels side by side sharing one x axis kind, each
//! with its own y axis, and one legend under them. Written by hand so that the binary needs no
//! plotting crate; the output is plain SVG 1.1 that browsers and `rsvg-convert` render.
//!
//! The x axis is logarithmic (base 2) over the data's range, with a tick at every distinct x,
//! which suits concurrency levels such as 1, 4, 16, 64. A y axis is linear from 0 to a round
//! number, or logarithmic over whole decades (for latencies that span orders of magnitude).
//! Missing points (`None`, or values a log axis cannot show) break a curve instead of
//! dropping to zero.

use std::fmt::Write as _;

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const GRAY: &str = "#555555";

const PANEL_W: f64 = 500.0;
const PLOT_W: f64 = 390.0;
const PLOT_H: f64 = 300.0;
const LEFT: f64 = 85.0;
const TOP: f64 = 90.0;
const LEGEND_TOP: f64 = TOP + PLOT_H + 70.0;
const LEGEND_ROW: f64 = 22.0;
const LEGEND_PER_ROW: usize = 4;

/// How a curve's line is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dash {
    Solid,
    Dashed,
    Dotted,
}

impl Dash {
    fn attr(self) -> &'static str {
        match self {
            Dash::Solid => "",
            Dash::Dashed => r#" stroke-dasharray="7 4""#,
            Dash::Dotted => r#" stroke-dasharray="2 3""#,
        }
    }
}

/// One line: `(x, y)` points in x order; `color` indexes the palette.
#[derive(Debug, Clone)]
pub struct Curve {
    pub label: String,
    pub color: usize,
    pub dash: Dash,
    pub points: Vec<(f64, Option<f64>)>,
}

/// One plot area with its y axis.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub log_y: bool,
    pub curves: Vec<Curve>,
}

/// One legend item; `color: None` draws it gray (for a line style shared by all colors).
#[derive(Debug, Clone)]
pub struct LegendEntry {
    pub label: String,
    pub color: Option<usize>,
    pub dash: Dash,
}

#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub subtitle: String,
    pub x_label: String,
    pub panels: Vec<Panel>,
    pub legend: Vec<LegendEntry>,
}

/// Escapes text for SVG content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn color(i: Option<usize>) -> &'static str {
    i.map_or(GRAY, |i| PALETTE[i % PALETTE.len()])
}

/// A tick label: integers plainly, thousands as `k`, small numbers with few decimals.
fn fmt_num(v: f64) -> String {
    let a = v.abs();
    let s = if a >= 10_000.0 {
        format!("{}k", trim(format!("{:.1}", v / 1e3)))
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.1}"))
    } else {
        trim(format!("{v:.3}"))
    };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A y axis: maps values to [0, 1] and lists its ticks.
#[derive(Debug, Clone, Copy)]
enum Scale {
    Linear { hi: f64, step: f64 },
    Log { lo: f64, hi: f64 },
}

impl Scale {
    fn linear(max: f64) -> Scale {
        let max = if max.is_finite() && max > 0.0 {
            max
        } else {
            1.0
        };
        let raw = max / 5.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag);
        Scale::Linear {
            hi: (max / step).ceil() * step,
            step,
        }
    }

    fn log(min: f64, max: f64) -> Scale {
        if !(min.is_finite() && max.is_finite() && min > 0.0) {
            return Scale::Log { lo: 1.0, hi: 10.0 };
        }
        let lo = 10f64.powf(min.log10().floor());
        let hi = 10f64.powf(max.log10().ceil()).max(lo * 10.0);
        Scale::Log { lo, hi }
    }

    fn shows(&self, v: f64) -> bool {
        v.is_finite() && (matches!(self, Scale::Linear { .. }) || v > 0.0)
    }

    fn frac(&self, v: f64) -> f64 {
        match *self {
            Scale::Linear { hi, .. } => v / hi,
            Scale::Log { lo, hi } => (v / lo).log10() / (hi / lo).log10(),
        }
    }

    fn ticks(&self) -> Vec<f64> {
        match *self {
            Scale::Linear { hi, step } => {
                let n = (hi / step).round() as usize;
                (0..=n).map(|i| i as f64 * step).collect()
            }
            Scale::Log { lo, hi } => {
                let decades = (hi / lo).log10().round() as i32;
                let mults: &[f64] = if decades <= 2 {
                    &[1.0, 2.0, 5.0]
                } else {
                    &[1.0]
                };
                let mut t = Vec::new();
                for d in 0..=decades {
                    for m in mults {
                        let v = lo * 10f64.powi(d) * m;
                        if v <= hi * 1.000_001 {
                            t.push(v);
                        }
                    }
                }
                t
            }
        }
    }
}

/// The x axis: log2 between the smallest and largest x, with some room at both ends.
#[derive(Debug, Clone, Copy)]
struct XAxis {
    lo: f64,
    hi: f64,
}

impl XAxis {
    fn frac(&self, x: f64) -> f64 {
        if self.hi <= self.lo {
            return 0.5;
        }
        let f = (x / self.lo).log2() / (self.hi / self.lo).log2();
        0.06 + 0.88 * f
    }
}

/// The chart as an SVG document.
pub fn render(chart: &Chart) -> String {
    let width = PANEL_W * chart.panels.len().max(1) as f64;
    let rows = chart.legend.len().div_ceil(LEGEND_PER_ROW);
    let height = LEGEND_TOP + rows as f64 * LEGEND_ROW + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="18" font-weight="bold">{}</text>"#,
        width / 2.0,
        escape(&chart.title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="50" text-anchor="middle" font-size="13" fill="#333">{}</text>"##,
        width / 2.0,
        escape(&chart.subtitle)
    );
    let xs: Vec<f64> = chart
        .panels
        .iter()
        .flat_map(|p| &p.curves)
        .flat_map(|c| c.points.iter().map(|p| p.0))
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    let x_axis = XAxis {
        lo: xs.iter().copied().fold(f64::INFINITY, f64::min).min(1e300),
        hi: xs.iter().copied().fold(0.0, f64::max),
    };
    let mut ticks = xs.clone();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for (i, panel) in chart.panels.iter().enumerate() {
        let x0 = i as f64 * PANEL_W + LEFT;
        draw_panel(&mut s, panel, x0, x_axis, &ticks, &chart.x_label);
    }
    draw_legend(&mut s, &chart.legend, width);
    s.push_str("</svg>\n");
    s
}

fn draw_panel(s: &mut String, p: &Panel, x0: f64, x_axis: XAxis, x_ticks: &[f64], x_label: &str) {
    let values: Vec<f64> = p
        .curves
        .iter()
        .flat_map(|c| c.points.iter().filter_map(|pt| pt.1))
        .filter(|v| v.is_finite() && (!p.log_y || *v > 0.0))
        .collect();
    let max = values.iter().copied().fold(0.0, f64::max);
    let scale = if p.log_y {
        Scale::log(values.iter().copied().fold(f64::INFINITY, f64::min), max)
    } else {
        Scale::linear(max)
    };
    let (y0, y1) = (TOP, TOP + PLOT_H);
    let px = |x: f64| x0 + x_axis.frac(x) * PLOT_W;
    let py = |v: f64| y1 - scale.frac(v).clamp(0.0, 1.0) * PLOT_H;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="14" font-weight="bold">{}</text>"#,
        x0 + PLOT_W / 2.0,
        y0 - 12.0,
        escape(&p.title)
    );
    for t in scale.ticks() {
        let y = py(t);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##,
            x0 + PLOT_W
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            x0 - 6.0,
            y + 4.0,
            fmt_num(t)
        );
    }
    let mut last_label = f64::NEG_INFINITY;
    for &t in x_ticks {
        let x = px(t);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{y1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/>"##,
            y1 + 5.0
        );
        if x - last_label >= 24.0 {
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                y1 + 19.0,
                fmt_num(t)
            );
            last_label = x;
        }
    }
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{y0}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        x0 + PLOT_W / 2.0,
        y1 + 40.0,
        escape(x_label)
    );
    let (lx, ly) = (x0 - 58.0, y0 + PLOT_H / 2.0);
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="middle" transform="rotate(-90 {lx:.1} {ly:.1})">{}</text>"#,
        escape(&p.y_label)
    );
    for c in &p.curves {
        let col = color(Some(c.color));
        let shown = |pt: &(f64, Option<f64>)| match pt.1 {
            Some(v) if scale.shows(v) && pt.0 > 0.0 => Some((px(pt.0), py(v), v)),
            _ => None,
        };
        let mut run: Vec<(f64, f64)> = Vec::new();
        let flush = |run: &mut Vec<(f64, f64)>, s: &mut String| {
            if run.len() >= 2 {
                let pts: Vec<String> = run.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{col}" stroke-width="2"{}/>"#,
                    pts.join(" "),
                    c.dash.attr()
                );
            }
            run.clear();
        };
        for pt in &c.points {
            match shown(pt) {
                Some((x, y, _)) => run.push((x, y)),
                None => flush(&mut run, s),
            }
        }
        flush(&mut run, s);
        for pt in &c.points {
            if let Some((x, y, v)) = shown(pt) {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{col}"><title>{}: {} at {}</title></circle>"#,
                    escape(&c.label),
                    fmt_num(v),
                    fmt_num(pt.0)
                );
            }
        }
    }
}

fn draw_legend(s: &mut String, legend: &[LegendEntry], width: f64) {
    let col_w = (width - 2.0 * LEFT) / LEGEND_PER_ROW as f64;
    for (i, e) in legend.iter().enumerate() {
        let x = LEFT + (i % LEGEND_PER_ROW) as f64 * col_w;
        let y = LEGEND_TOP + (i / LEGEND_PER_ROW) as f64 * LEGEND_ROW;
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2"{}/>"#,
            x + 28.0,
            color(e.color),
            e.dash.attr()
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 34.0,
            y + 4.0,
            escape(&e.label)
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Checks that every element is closed in order and returns the element names seen.
    pub(crate) fn check_well_formed(svg: &str) -> Vec<String> {
        let mut stack: Vec<String> = Vec::new();
        let mut names = Vec::new();
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let close = rest[open..].find('>').map(|c| open + c);
            let Some(close) = close else {
                panic!("unclosed '<' in {rest:?}");
            };
            let tag = &rest[open + 1..close];
            assert!(!tag.contains('<'), "'<' inside a tag: {tag:?}");
            assert_eq!(
                tag.matches('"').count() % 2,
                0,
                "unbalanced quotes: {tag:?}"
            );
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(
                    stack.pop().as_deref(),
                    Some(name.trim()),
                    "bad close {tag:?}"
                );
            } else {
                let name = tag
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .trim_end_matches('/');
                names.push(name.to_string());
                if !tag.ends_with('/') {
                    stack.push(name.to_string());
                }
            }
            let text = &rest[close + 1..];
            let text_end = text.find('<').unwrap_or(text.len());
            for (at, _) in text[..text_end].match_indices('&') {
                let ent = &text[at..text_end];
                assert!(
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                        .iter()
                        .any(|e| ent.starts_with(e)),
                    "bare '&' in {ent:?}"
                );
            }
            rest = text;
        }
        assert!(stack.is_empty(), "unclosed elements {stack:?}");
        names
    }

    fn chart(xs: &[f64], log_y: bool) -> Chart {
        let curve = |label: &str, color, dash, f: fn(f64) -> f64| Curve {
            label: label.into(),
            color,
            dash,
            points: xs.iter().map(|&x| (x, Some(f(x)))).collect(),
        };
        Chart {
            title: "model <a&b>".into(),
            subtitle: "input 100 / output 128".into(),
            x_label: "concurrency".into(),
            panels: vec![
                Panel {
                    title: "Output tokens/s".into(),
                    y_label: "tok/s".into(),
                    log_y: false,
                    curves: vec![curve("ferrum", 0, Dash::Solid, |x| 30.0 * x)],
                },
                Panel {
                    title: "Latency".into(),
                    y_label: "ms".into(),
                    log_y,
                    curves: vec![
                        curve("ferrum TTFT p50", 0, Dash::Solid, |x| 40.0 * x),
                        curve("ferrum ITL p50", 0, Dash::Dotted, |x| 10.0 + x),
                    ],
                },
            ],
            legend: vec![LegendEntry {
                label: "ferrum".into(),
                color: Some(0),
                dash: Dash::Solid,
            }],
        }
    }

    #[test]
    fn renders_well_formed_svg_with_the_series() {
        for (xs, log_y) in [(vec![1.0, 4.0, 16.0], true), (vec![8.0], false)] {
            let svg = render(&chart(&xs, log_y));
            assert!(svg.starts_with("<svg"));
            let names = check_well_formed(&svg);
            assert_eq!(names.first().map(String::as_str), Some("svg"));
            assert!(svg.contains("model &lt;a&amp;b&gt;"));
            assert!(svg.contains("ferrum TTFT p50"));
            assert_eq!(svg.contains("stroke-dasharray"), xs.len() > 1);
            let polylines = names.iter().filter(|n| *n == "polyline").count();
            assert_eq!(polylines, if xs.len() > 1 { 3 } else { 0 });
            assert_eq!(
                names.iter().filter(|n| *n == "circle").count(),
                3 * xs.len()
            );
            assert!(!svg.contains("NaN") && !svg.contains("inf"));
        }
    }

    #[test]
    fn gaps_break_curves_and_empty_panels_render() {
        let mut c = chart(&[1.0, 2.0, 4.0, 8.0], true);
        c.panels[0].curves[0].points[1].1 = None;
        let svg = render(&c);
        check_well_formed(&svg);
        // 1 -- gap -- 4, 8: the first curve is one segment of two points.
        assert_eq!(svg.matches("<polyline").count(), 3);
        let empty = Chart {
            panels: vec![Panel {
                title: "nothing".into(),
                y_label: "ms".into(),
                log_y: true,
                curves: Vec::new(),
            }],
            ..c
        };
        let svg = render(&empty);
        check_well_formed(&svg);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn scales_and_numbers() {
        let Scale::Linear { hi, step } = Scale::linear(873.0) else {
            panic!("linear");
        };
        assert_eq!((hi, step), (1000.0, 200.0));
        let t = Scale::log(3.0, 450.0).ticks();
        assert_eq!(t.first().copied(), Some(1.0));
        assert_eq!(t.last().copied(), Some(1000.0));
        assert_eq!(fmt_num(2.5), "2.5");
        assert_eq!(fmt_num(1200.0), "1200");
        assert_eq!(fmt_num(25_000.0), "25k");
        assert_eq!(fmt_num(0.05), "0.05");
    }
}

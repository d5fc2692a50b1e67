//! The figures of `BENCHMARKS.md`, drawn from its own tables: each SVG
//! under `docs/figures/` is made from the numbers of the run the file
//! reports, so a new run's tables make new figures.
//!
//! ```text
//! cargo run --example figures            # reads BENCHMARKS.md, writes docs/figures/*.svg
//! ```
//!
//! Plain SVG written by hand: no plotting dependency, and the output is
//! the same bytes for the same tables (diffable in review).

use std::fmt::Write as _;
use std::path::Path;

/// A table of `BENCHMARKS.md`: its header cells and its rows, cells
/// trimmed, bold marks and thousands separators removed.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// The first table after the first line that starts with `marker`.
    fn after(text: &str, marker: &str) -> Result<Table, String> {
        let start = text
            .lines()
            .position(|line| line.starts_with(marker))
            .ok_or_else(|| format!("no line starts with {marker:?} in BENCHMARKS.md"))?;
        let mut lines = text
            .lines()
            .skip(start + 1)
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'));
        let cells = |line: &str| -> Vec<String> {
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().replace("**", "").replace(',', ""))
                .collect()
        };
        let header = cells(
            lines
                .next()
                .ok_or_else(|| format!("no table after {marker:?}"))?,
        );
        let rows = lines.skip(1).map(cells).collect();
        Ok(Table { header, rows })
    }

    /// The column named `name`.
    fn column(&self, name: &str) -> Result<usize, String> {
        self.header
            .iter()
            .position(|cell| cell == name)
            .ok_or_else(|| format!("no column {name:?} in {:?}", self.header))
    }

    /// The number in `row`'s cell at `column`.
    fn number(&self, row: &[String], column: usize) -> Result<f64, String> {
        let cell = row.get(column).ok_or("a short row")?;
        cell.parse()
            .map_err(|_| format!("{cell:?} is not a number (row {row:?})"))
    }

    /// The row whose first cell is `name`.
    fn row(&self, name: &str) -> Result<&[String], String> {
        self.rows
            .iter()
            .find(|row| row.first().is_some_and(|cell| cell == name))
            .map(Vec::as_slice)
            .ok_or_else(|| format!("no row {name:?}"))
    }
}

/// One line or bar series: a name, a colour, its values.
struct Series {
    name: String,
    colour: &'static str,
    values: Vec<f64>,
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 110.0;
const TURNSTILE: &str = "#1f77b4";
const TURNSTILE_LIGHT: &str = "#9ecae1";
const GOVERNOR: &str = "#d62728";
const GOVERNOR_LIGHT: &str = "#fc9272";

/// The top of the y axis: a round number at or above `max`.
fn axis_top(max: f64) -> f64 {
    let step = 10f64.powf(max.log10().floor());
    (max / step).ceil() * step
}

/// Where a chart draws: the y axis's top value, the plot's height and
/// the width of one x slot.
struct Plot {
    top: f64,
    height: f64,
    slot: f64,
}

impl Plot {
    /// The height in pixels of `value`.
    fn scaled(&self, value: f64) -> f64 {
        self.height * value / self.top
    }

    /// The y pixel of `value`.
    fn y(&self, value: f64) -> f64 {
        TOP + self.height - self.scaled(value)
    }
}

/// The frame every figure shares (title, legend, y grid with labels, x
/// labels under evenly spaced slots), and where the chart draws in it.
fn frame(title: &str, y_label: &str, x: &[String], series: &[Series]) -> (String, Plot) {
    let max = series
        .iter()
        .flat_map(|s| &s.values)
        .fold(0.0f64, |a, &b| a.max(b));
    let top = axis_top(max);
    let mut out = String::new();
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{title}</text>"#,
        WIDTH / 2.0
    );
    for i in 0..=5 {
        let value = top * f64::from(i) / 5.0;
        let y = TOP + plot_h - plot_h * f64::from(i) / 5.0;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{value}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{y_label}</text>"#,
        TOP + plot_h / 2.0
    );
    let slot = plot_w / x.len() as f64;
    for (i, label) in x.iter().enumerate() {
        let cx = LEFT + slot * (i as f64 + 0.5);
        let y = TOP + plot_h + 14.0;
        let _ = writeln!(
            out,
            r#"<text transform="translate({cx:.1} {y:.1}) rotate(-30)" text-anchor="end" font-size="11">{label}</text>"#
        );
    }
    for (i, s) in series.iter().enumerate() {
        let (lx, ly) = (LEFT + 160.0 * i as f64, TOP - 8.0);
        let _ = writeln!(
            out,
            r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            ly - 10.0,
            s.colour,
            lx + 16.0,
            ly,
            s.name
        );
    }
    let plot = Plot {
        top,
        height: plot_h,
        slot,
    };
    (out, plot)
}

/// Lines over evenly spaced x slots.
fn line_chart(title: &str, y_label: &str, x: &[String], series: &[Series]) -> String {
    let (mut out, plot) = frame(title, y_label, x, series);
    for s in series {
        let points: Vec<String> = s
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let px = LEFT + plot.slot * (i as f64 + 0.5);
                let py = plot.y(*v);
                format!("{px:.1},{py:.1}")
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            s.colour,
            points.join(" ")
        );
        for point in &points {
            let (px, py) = point.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                out,
                r#"<circle cx="{px}" cy="{py}" r="3" fill="{}"/>"#,
                s.colour
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

/// Bars grouped by x slot, one bar per series, each labelled with its value.
fn bar_chart(title: &str, y_label: &str, x: &[String], series: &[Series]) -> String {
    let (mut out, plot) = frame(title, y_label, x, series);
    let bar = plot.slot * 0.8 / series.len() as f64;
    for (j, s) in series.iter().enumerate() {
        for (i, v) in s.values.iter().enumerate() {
            let bx = LEFT + plot.slot * (i as f64 + 0.1) + bar * j as f64;
            let h = plot.scaled(*v);
            let _ = writeln!(
                out,
                r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{v}</text>"#,
                plot.y(*v),
                bar - 1.0,
                s.colour,
                bx + bar / 2.0,
                plot.y(*v) - 3.0
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

/// Bytes per key against governor's, from 100,000 to 2,000,000 keys.
fn bytes_per_key(text: &str) -> Result<String, String> {
    let table = Table::after(text, "Bytes per key from 100,000")?;
    let keys = table.column("keys")?;
    let x = table
        .rows
        .iter()
        .map(|row| {
            let n: f64 = table.number(row, keys)?;
            Ok(format!("{}k", n / 1_000.0))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let series = [
        ("turnstile `u64`", "turnstile u64", TURNSTILE),
        ("governor `u64`", "governor u64", GOVERNOR),
        (
            "turnstile 16-byte `String`",
            "turnstile String16",
            TURNSTILE_LIGHT,
        ),
        ("governor `String`", "governor String16", GOVERNOR_LIGHT),
    ]
    .into_iter()
    .map(|(column, name, colour)| {
        let column = table.column(column)?;
        let values = table
            .rows
            .iter()
            .map(|row| table.number(row, column))
            .collect::<Result<_, _>>()?;
        Ok(Series {
            name: name.to_owned(),
            colour,
            values,
        })
    })
    .collect::<Result<Vec<_>, String>>()?;
    Ok(line_chart(
        "Heap bytes per key (BENCHMARKS.md, Memory)",
        "bytes per key",
        &x,
        &series,
    ))
}

/// Latency percentiles against governor's, per row pair.
fn latency(text: &str) -> Result<String, String> {
    let table = Table::after(text, "## Latency percentiles")?;
    let pairs = [
        ("direct", "turnstile `DirectLimiter`", "governor direct"),
        ("1k keys", "turnstile 1000 keys", "governor ahash 1000 keys"),
        (
            "1M keys",
            "turnstile 1000000 keys",
            "governor ahash 1000000 keys",
        ),
    ];
    let columns = ["mean", "P50", "P99", "P99.9"];
    let mut x = Vec::new();
    let mut turnstile = Vec::new();
    let mut governor = Vec::new();
    for (label, ours, theirs) in pairs {
        let (ours, theirs) = (table.row(ours)?, table.row(theirs)?);
        for column in columns {
            let at = table.column(column)?;
            x.push(format!("{column}, {label}"));
            turnstile.push(table.number(ours, at)?);
            governor.push(table.number(theirs, at)?);
        }
    }
    let series = [
        Series {
            name: "turnstile".into(),
            colour: TURNSTILE,
            values: turnstile,
        },
        Series {
            name: "governor".into(),
            colour: GOVERNOR,
            values: governor,
        },
    ];
    Ok(bar_chart(
        "ns per check, one thread (BENCHMARKS.md, Latency percentiles)",
        "ns",
        &x,
        &series,
    ))
}

/// ns per admitted check on one and two threads against governor ahash.
fn threads(text: &str) -> Result<String, String> {
    let table = Table::after(text, "## Keyed: ns per check")?;
    let (workload, mode, thr) = (
        table.column("workload")?,
        table.column("mode")?,
        table.column("thr")?,
    );
    let (ours, theirs) = (table.column("turnstile")?, table.column("governor ahash")?);
    let rows: Vec<&Vec<String>> = table
        .rows
        .iter()
        .filter(|row| row[mode] == "allowed" && !row[workload].contains("churn"))
        .collect();
    let x = rows
        .iter()
        .map(|row| {
            let w = row[workload]
                .replace("u64, ", "")
                .replace(" over 1000000", "")
                .replace("1000000 keys uniform", "1M uniform")
                .replace("1000 keys", "1k keys")
                .replace("1 hot key", "hot key");
            format!("{w} x{}", row[thr])
        })
        .collect::<Vec<_>>();
    let values = |column| -> Result<Vec<f64>, String> {
        rows.iter().map(|row| table.number(row, column)).collect()
    };
    let series = [
        Series {
            name: "turnstile".into(),
            colour: TURNSTILE,
            values: values(ours)?,
        },
        Series {
            name: "governor ahash".into(),
            colour: GOVERNOR,
            values: values(theirs)?,
        },
    ];
    Ok(bar_chart(
        "ns per admitted check, 1 and 2 threads (BENCHMARKS.md, Keyed)",
        "ns per check",
        &x,
        &series,
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("BENCHMARKS.md"))?;
    let dir = root.join("docs/figures");
    std::fs::create_dir_all(&dir)?;
    for (name, svg) in [
        ("bytes_per_key.svg", bytes_per_key(&text)?),
        ("latency.svg", latency(&text)?),
        ("threads.svg", threads(&text)?),
    ] {
        std::fs::write(dir.join(name), svg)?;
        println!("docs/figures/{name}");
    }
    Ok(())
}

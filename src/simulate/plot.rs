//! The PNG plot of `gpushare simulate`: one panel per trace, unallocated GPU % (median over
//! seeds, band min–max) against arrived load from 80 to the replay's maximum, one line per
//! policy, the published medians as crosses.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use super::report::{TraceReport, published};

/// Why the plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot")]
    Empty,
    #[error("{0}")]
    Font(String),
    #[error("cannot draw the plot: {0}")]
    Draw(String),
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
}

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for PlotError {
    fn from(e: DrawingAreaErrorKind<E>) -> Self {
        PlotError::Draw(e.to_string())
    }
}

/// First arrived load on the x axis (percent of capacity).
const FROM_LOAD: usize = 80;

/// Where a sans-serif TrueType font is looked for (first found wins); `GPUSHARE_FONT` first.
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

fn color(policy: &str) -> RGBColor {
    match policy {
        "gpushare" => RGBColor(44, 160, 44),
        "fgd" | "FGD" => RGBColor(31, 119, 180),
        "bestfit" | "BestFit" => RGBColor(255, 127, 14),
        "binpack" => RGBColor(148, 103, 189),
        "spread" => RGBColor(127, 127, 127),
        _ => RGBColor(0, 0, 0),
    }
}

/// Registers the font once; the error names the paths tried.
fn font() -> Result<(), PlotError> {
    static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        let mut tried: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("GPUSHARE_FONT") {
            tried.push(p.into());
        }
        tried.extend(FONT_PATHS.iter().map(PathBuf::from));
        for p in &tried {
            if let Ok(bytes) = std::fs::read(p) {
                // The font lives as long as the process (plotters keeps a 'static reference).
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(p.clone());
                }
            }
        }
        let names: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        Err(format!(
            "no TrueType font to label the plot: tried {} (install fonts-dejavu-core or set GPUSHARE_FONT)",
            names.join(", ")
        ))
    });
    loaded
        .as_ref()
        .map(|_| ())
        .map_err(|e| PlotError::Font(e.clone()))
}

/// Writes the plot of `reports` to `path` (PNG).
pub fn write_png(reports: &[TraceReport], path: &Path) -> Result<(), PlotError> {
    if reports.is_empty() {
        return Err(PlotError::Empty);
    }
    font()?;
    let cols = reports.len().min(3);
    let rows = reports.len().div_ceil(cols);
    let (w, h) = (560 * cols as u32, 460 * rows as u32 + 40);
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled(
        "GPU capacity left unallocated vs arrived load (median; band: min-max over seeds)",
        ("sans-serif", 20),
    )?;
    let panels = body.split_evenly((rows, cols));
    for (panel, report) in panels.iter().zip(reports) {
        draw_panel(panel, report)?;
    }
    root.present().map_err(|e| PlotError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    r: &TraceReport,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let max_load = r
        .results
        .iter()
        .filter_map(|p| p.curve.last().map(|(l, _)| *l))
        .max()
        .unwrap_or(130)
        .max(FROM_LOAD + 1);
    let top = r
        .results
        .iter()
        .flat_map(|p| p.curve.iter().filter(|(l, _)| *l >= FROM_LOAD + 5))
        .map(|(_, s)| s.max)
        .fold(5.0_f64, f64::max)
        * 1.25;
    let top = top.min(100.0 - FROM_LOAD as f64 + 2.0).max(5.0);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{}: {} nodes, {} GPUs, {} seeds",
                r.trace,
                r.nodes,
                r.gpus,
                r.seeds.len()
            ),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(FROM_LOAD as f64..max_load as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("arrived GPU demand (% of capacity)")
        .y_desc("unallocated GPUs (% of capacity)")
        .label_style(("sans-serif", 12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for p in &r.results {
        let c = color(&p.policy);
        let pts: Vec<_> = p.curve.iter().filter(|(l, _)| *l >= FROM_LOAD).collect();
        let mut band: Vec<(f64, f64)> = pts.iter().map(|(l, s)| (*l as f64, s.max)).collect();
        band.extend(pts.iter().rev().map(|(l, s)| (*l as f64, s.min)));
        chart.draw_series(std::iter::once(Polygon::new(band, c.mix(0.18).filled())))?;
        let at100 = p
            .unallocated
            .get(2)
            .copied()
            .flatten()
            .map_or(String::new(), |s| format!(" ({:.2} % at 100 %)", s.median));
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|(l, s)| (*l as f64, s.median)),
                c.stroke_width(2),
            ))?
            .label(format!("{}{at100}", p.policy))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    for (name, vals) in published(&r.trace) {
        let c = color(name);
        chart
            .draw_series(
                vals.iter()
                    .map(|&(l, v)| Cross::new((l as f64, v), 5, c.stroke_width(2))),
            )?
            .label(format!("published {name}"))
            .legend(move |(x, y)| Cross::new((x + 9, y), 4, c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 11))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .draw()?;
    Ok(())
}

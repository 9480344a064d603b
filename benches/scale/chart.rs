//! The chart `benches/throughput.svg`: fresh calls per second against callers, with each
//! store's limit.

use std::path::Path;

/// Throughput against callers, with each store's limit, on log–log axes.
pub(crate) fn draw(
    path: &Path,
    sled: &[(usize, f64, f64)],
    pg: &[(usize, f64, f64)],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let points = sled.iter().chain(pg);
    let top = points.clone().map(|&(_, rate, limit)| rate.max(limit)).fold(1.0, f64::max) * 1.5;
    let bottom = points.map(|&(_, rate, limit)| rate.min(limit)).fold(f64::MAX, f64::min) / 1.5;
    let root = SVGBackend::new(path, (760, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Fresh calls per second against concurrent callers", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d((0.8f64..40.0).log_scale(), (bottom.max(1.0)..top).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("concurrent callers")
        .y_desc("calls/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    let series = [
        ("sled, measured", sled, false, RGBColor(30, 80, 200)),
        ("sled, limit: callers ÷ 2 durable points", sled, true, RGBColor(130, 160, 240)),
        ("PostgreSQL fleet, measured", pg, false, RGBColor(200, 40, 40)),
        ("PostgreSQL, limit: callers ÷ 2 commits", pg, true, RGBColor(240, 140, 140)),
    ];
    for (label, curve, limit, color) in series {
        if curve.is_empty() {
            continue;
        }
        let line: Vec<(f64, f64)> = curve
            .iter()
            .map(|&(callers, rate, bound)| (callers as f64, if limit { bound } else { rate }))
            .collect();
        let style = if limit { color.stroke_width(1) } else { color.stroke_width(3) };
        chart
            .draw_series(LineSeries::new(line.clone(), style))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

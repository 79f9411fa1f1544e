//! Line charts for the dashboard, drawn on the server as inline SVG with plotters (the
//! library `agl train --plot` uses), so the pages need no chart script.

use plotters::prelude::*;

/// One line: its legend and its points (x ascending).
pub(crate) struct Line {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

/// A chart's labels and the y range it must show.
pub(crate) struct ChartSpec<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_desc: &'a str,
    pub(crate) y_desc: &'a str,
    /// A range the y axis always covers (rates: 0..1); the data may widen it.
    pub(crate) y_floor: Option<(f64, f64)>,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(47, 111, 222),
    RGBColor(194, 59, 43),
    RGBColor(28, 140, 78),
    RGBColor(122, 79, 214),
    RGBColor(183, 121, 31),
    RGBColor(20, 140, 160),
    RGBColor(200, 70, 150),
    RGBColor(90, 90, 90),
];

fn err(e: impl std::fmt::Display) -> String {
    format!("chart: {e}")
}

/// Renders `lines` as an SVG element of class `chart` (width 100% by the stylesheet).
///
/// # Errors
/// A drawing error of plotters, as text.
pub(crate) fn line_chart(spec: &ChartSpec<'_>, lines: &[Line]) -> Result<String, String> {
    let points = || lines.iter().flat_map(|l| l.points.iter());
    let (mut x0, mut x1) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
        (a.min(p.0), b.max(p.0))
    });
    let (mut y0, mut y1) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
        (a.min(p.1), b.max(p.1))
    });
    if !(x0.is_finite() && x1.is_finite()) {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if let Some((lo, hi)) = spec.y_floor {
        y0 = if y0.is_finite() { y0.min(lo) } else { lo };
        y1 = if y1.is_finite() { y1.max(hi) } else { hi };
    }
    if !(y0.is_finite() && y1.is_finite()) {
        (y0, y1) = (0.0, 1.0);
    }
    let pad = ((y1 - y0).abs() * 0.05).max(1e-6);
    let (y0, y1) = (y0 - pad, y1 + pad);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (640, 300)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(spec.title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(spec.x_desc)
            .y_desc(spec.y_desc)
            .x_labels(6)
            .y_labels(6)
            .light_line_style(RGBColor(238, 241, 245))
            .draw()
            .map_err(err)?;
        for (i, line) in lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let drawn = chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?;
            drawn.label(line.name.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
            if line.points.len() == 1 {
                chart
                    .draw_series(
                        line.points
                            .iter()
                            .map(|p| Circle::new(*p, 3, color.filled())),
                    )
                    .map_err(err)?;
            }
        }
        if !lines.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(227, 231, 238))
                .draw()
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg.replacen("<svg ", "<svg class=\"chart\" role=\"img\" ", 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_with_one_path_per_line() {
        let lines = vec![
            Line {
                name: "policy-".into(),
                points: vec![(1.0, 0.1), (2.0, 0.4), (3.0, 0.8)],
            },
            Line {
                name: "other".into(),
                points: vec![(1.0, 0.5)],
            },
        ];
        let spec = ChartSpec {
            title: "accuracy",
            x_desc: "step",
            y_desc: "accuracy",
            y_floor: Some((0.0, 1.0)),
        };
        let svg = line_chart(&spec, &lines).unwrap();
        assert!(svg.starts_with("<svg class=\"chart\""));
        assert!(svg.contains("policy-") && svg.contains("other"));
        assert!(svg.contains("<polyline") || svg.contains("<path"));
        assert!(svg.contains("<circle"));
    }

    #[test]
    fn an_empty_chart_still_renders() {
        let spec = ChartSpec {
            title: "reward",
            x_desc: "step",
            y_desc: "reward",
            y_floor: None,
        };
        let svg = line_chart(&spec, &[]).unwrap();
        assert!(svg.contains("reward"));
    }
}

//! Learning-curve plots (SVG, plotters): reward, violation rate and accuracy per GRPO update,
//! one line per run, smoothed with a trailing moving average of 10 updates; and APO's
//! validation score per round ([`apo_scores`]).
//!
//! Not for the numbers plotted (the training reports) or for writing the file
//! ([`crate::out::files`]).

use agl_spider::{CurvePoint, RunReport};
use agl_train::apo::ApoReport;
use plotters::prelude::*;

const WINDOW: usize = 10;

/// Reads one metric off a curve point.
type Metric = fn(&CurvePoint) -> f64;

fn smooth(points: &[CurvePoint], f: Metric) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len());
    for (i, p) in points.iter().enumerate() {
        let lo = (i + 1).saturating_sub(WINDOW);
        let w = &points[lo..=i];
        let mean = w.iter().map(f).sum::<f64>() / w.len() as f64;
        out.push((p.rollouts as f64, mean));
    }
    out
}

/// Renders the curves of `runs` (name, report) as an SVG document: train reward, violation
/// rate and accuracy.
pub fn learning_curves(runs: &[(&str, &RunReport)]) -> anyhow::Result<String> {
    let curves: Vec<(&str, &[CurvePoint])> =
        runs.iter().map(|(n, r)| (*n, r.curve.as_slice())).collect();
    plot(
        &curves,
        &[
            ("train reward", |p| p.reward),
            ("train violation rate", |p| p.violation_rate),
            ("train accuracy", |p| p.accuracy),
        ],
    )
}

/// Renders the train reward and violation rate of `runs` (name, curve) as an SVG document:
/// the curves of a task without an accuracy of its own (`agl train --algorithm`).
pub fn reward_curves(runs: &[(&str, &[CurvePoint])]) -> anyhow::Result<String> {
    plot(
        runs,
        &[
            ("train reward", |p| p.reward),
            ("train violation rate", |p| p.violation_rate),
        ],
    )
}

/// APO's validation scores per round (round 0: the seed), on the whole validation set: the
/// round's leader and the best prompt so far.
pub fn apo_scores(report: &ApoReport) -> anyhow::Result<String> {
    let seed = report.candidates.first().and_then(|c| c.val_full.first());
    let mut leader: Vec<(f64, f64)> = seed.iter().map(|s| (0.0, s.score)).collect();
    let mut best = leader.clone();
    for r in &report.rounds {
        leader.push((r.round as f64, r.leader_score));
        if let Some(b) = r.best_score {
            best.push((r.round as f64, b));
        }
    }
    let (lo, hi) = leader
        .iter()
        .chain(&best)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        });
    let (lo, hi) = if lo.is_finite() && hi.is_finite() {
        let pad = ((hi - lo) * 0.1).max(0.05);
        (lo - pad, hi + pad)
    } else {
        (0.0, 1.0)
    };
    let x_max = (report.rounds.len() as f64).max(1.0);
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot: {e}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (520, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("APO: validation score per round", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, lo..hi)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("round")
            .x_labels(report.rounds.len() + 1)
            .y_labels(6)
            .draw()
            .map_err(|e| err(&e))?;
        for (name, points, color) in [("leader", leader, BLUE), ("best so far", best, RED)] {
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, color.filled())),
                )
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// One panel per metric, one line per run.
fn plot(runs: &[(&str, &[CurvePoint])], metrics: &[(&str, Metric)]) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let width = 400 * metrics.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut svg, (width, 420)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        let panels = root.split_evenly((1, metrics.len().max(1)));
        let colors = [RED, BLUE, GREEN, MAGENTA];
        let x_max = runs
            .iter()
            .flat_map(|(_, c)| c.last().map(|p| p.rollouts as f64))
            .fold(1.0, f64::max);
        for (panel, &(title, f)) in panels.iter().zip(metrics) {
            let series: Vec<(&str, Vec<(f64, f64)>)> =
                runs.iter().map(|(name, c)| (*name, smooth(c, f))).collect();
            let (mut lo, mut hi) = series
                .iter()
                .flat_map(|(_, s)| s.iter().map(|p| p.1))
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
                    (a.min(y), b.max(y))
                });
            if !lo.is_finite() || !hi.is_finite() {
                (lo, hi) = (0.0, 1.0);
            }
            if title != "train reward" {
                (lo, hi) = (0.0, hi.max(1e-3) * 1.05);
            } else {
                let pad = ((hi - lo).abs() * 0.05).max(0.1);
                (lo, hi) = (lo - pad, hi + pad);
            }
            let mut chart = ChartBuilder::on(panel)
                .caption(
                    format!("{title} (moving avg, {WINDOW} updates)"),
                    ("sans-serif", 16),
                )
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(50)
                .build_cartesian_2d(0f64..x_max, lo..hi)
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            chart
                .configure_mesh()
                .x_desc("rollouts")
                .x_labels(5)
                .y_labels(6)
                .draw()
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            for (i, (name, s)) in series.into_iter().enumerate() {
                let color = colors[i % colors.len()];
                chart
                    .draw_series(LineSeries::new(s, color.stroke_width(2)))
                    .map_err(|e| anyhow::anyhow!("plot: {e}"))?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        }
        root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    Ok(svg)
}

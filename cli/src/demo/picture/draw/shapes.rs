//! The shapes of the marks, shared by the lanes and the legend's samples.

use super::*;

pub(super) fn bar(w: &mut W, x1: f64, x2: f64, y: f64) -> io::Result<()> {
    tag("rect")
        .px("x", x1)
        .px("y", y)
        .px("width", (x2 - x1).max(1.0))
        .px("height", 15.0)
        .at("rx", 2)
        .at("fill", TERM)
        .empty(w)
}

pub(super) fn lease_box(w: &mut W, x1: f64, x2: f64, y: f64) -> io::Result<()> {
    tag("rect")
        .px("x", x1)
        .px("y", y + 0.5)
        .px("width", (x2 - x1).max(1.0))
        .px("height", 14.0)
        .at("fill", "none")
        .at("stroke", TERM)
        .at("stroke-dasharray", "3 2")
        .empty(w)
}

pub(super) fn wait_box(w: &mut W, x1: f64, x2: f64, y: f64) -> io::Result<()> {
    tag("rect")
        .px("x", x1)
        .px("y", y)
        .px("width", (x2 - x1).max(1.0))
        .px("height", 20.0)
        .at("fill", CANDIDATE)
        .at("fill-opacity", 0.2)
        .at("stroke", CANDIDATE)
        .at("stroke-dasharray", "4 2")
        .empty(w)
}

pub(super) fn tick(w: &mut W, x: f64, y: f64) -> io::Result<()> {
    tag("line")
        .px("x1", x)
        .px("y1", y - 8.0)
        .px("x2", x)
        .px("y2", y + 8.0)
        .at("stroke", BEAT)
        .at("stroke-width", 1.5)
        .empty(w)
}

pub(super) fn diamond(w: &mut W, x: f64, y: f64) -> io::Result<()> {
    let r = 6.0;
    tag("polygon")
        .at(
            "points",
            format!(
                "{x:.1},{:.1} {:.1},{y:.1} {x:.1},{:.1} {:.1},{y:.1}",
                y - r,
                x + r,
                y + r,
                x - r
            ),
        )
        .at("fill", CANDIDATE)
        .at("stroke", WAIT_TEXT)
        .empty(w)
}

pub(super) fn cross(w: &mut W, x: f64, y: f64) -> io::Result<()> {
    let r = 7.0;
    for (dx1, dy1, dx2, dy2) in [(-r, -r, r, r), (-r, r, r, -r)] {
        tag("line")
            .px("x1", x + dx1)
            .px("y1", y + dy1)
            .px("x2", x + dx2)
            .px("y2", y + dy2)
            .at("stroke", CRASH)
            .at("stroke-width", 3)
            .at("stroke-linecap", "round")
            .empty(w)?;
    }
    Ok(())
}

pub(super) fn square(w: &mut W, x: f64, y: f64) -> io::Result<()> {
    tag("rect")
        .px("x", x - 6.0)
        .px("y", y - 6.0)
        .px("width", 12.0)
        .px("height", 12.0)
        .at("fill", REAP)
        .empty(w)
}

pub(super) fn dot(w: &mut W, x: f64, y: f64) -> io::Result<()> {
    tag("circle")
        .px("cx", x)
        .px("cy", y)
        .px("r", 5.0)
        .at("fill", "#ffffff")
        .at("stroke", REDIS)
        .at("stroke-width", 2)
        .empty(w)
}

pub(super) fn vline(w: &mut W, x: f64, y1: f64, y2: f64) -> io::Result<()> {
    tag("line")
        .px("x1", x)
        .px("y1", y1)
        .px("x2", x)
        .px("y2", y2)
        .at("stroke", REDIS)
        .at("stroke-width", 1.5)
        .at("stroke-dasharray", "6 4")
        .empty(w)
}

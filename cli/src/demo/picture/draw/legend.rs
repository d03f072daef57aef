//! The legend: a sample of each mark with what it means.

use super::shapes::*;
use super::*;

/// A legend entry: the mark's class and what it means.
pub(super) type Item = (&'static str, &'static str);

pub(super) fn legend_items(p: &Picture) -> Vec<Item> {
    let mut items = vec![
        ("beat", "heartbeat"),
        ("term", "leader term, with its epoch"),
        (
            "lease-expiry",
            "lease a crashed leader left, until its TTL ran out",
        ),
        ("candidate", "candidates: named stale (phase one)"),
        ("two-phase-wait", "two-phase wait, then re-check"),
        ("crash", "crash"),
        ("reap", "reap (rooms and peers deleted)"),
        ("stop", "shut down"),
    ];
    if !p.redis.is_empty() {
        items.push(("failover", "Redis failover"));
    }
    if p.lanes.iter().any(|l| !l.notes.is_empty()) {
        items.push(("note", "other note (hover)"));
    }
    items
}

/// Each item's (x, row), and how many rows.
pub(super) fn legend_layout(items: &[Item]) -> (Vec<(f64, usize)>, usize) {
    let (mut x, mut row) = (LEFT, 0);
    let mut at = Vec::with_capacity(items.len());
    for (_, text) in items {
        let width = 26.0 + text.len() as f64 * CHAR_W + 18.0;
        if x + width > WIDTH - RIGHT && x > LEFT {
            x = LEFT;
            row += 1;
        }
        at.push((x, row));
        x += width;
    }
    (at, row + 1)
}

pub(super) fn legend(w: &mut W, items: &[Item], y: f64) -> io::Result<()> {
    let (at, _) = legend_layout(items);
    tag("g").at("id", "legend").with(w, |w| {
        label(12.0, y + 4.0)
            .at("font-weight", "bold")
            .text(w, "legend")?;
        for ((class, text), (x, row)) in items.iter().zip(at) {
            let cy = y + row as f64 * LEGEND_ROW;
            tag("g")
                .at("class", "legend-item")
                .at("data-mark", class)
                .with(w, |w| {
                    glyph(w, class, x + 10.0, cy)?;
                    label(x + 26.0, cy + 4.0).text(w, text)
                })?;
        }
        Ok(())
    })
}

/// The legend's sample of mark `class`, centred on (x, y).
fn glyph(w: &mut W, class: &str, x: f64, y: f64) -> io::Result<()> {
    match class {
        "beat" => tick(w, x, y),
        "term" => bar(w, x - 10.0, x + 10.0, y - 7.5),
        "lease-expiry" => lease_box(w, x - 10.0, x + 10.0, y - 7.5),
        "candidate" => diamond(w, x, y),
        "two-phase-wait" => wait_box(w, x - 10.0, x + 10.0, y - 10.0),
        "crash" => cross(w, x, y),
        "reap" => square(w, x, y),
        "failover" => vline(w, x, y - 9.0, y + 9.0),
        "stop" => tag("line")
            .px("x1", x)
            .px("y1", y - 9.0)
            .px("x2", x)
            .px("y2", y + 9.0)
            .at("stroke", GREY)
            .at("stroke-width", 3)
            .empty(w),
        _ => dot(w, x, y),
    }
}

//! The SVG of a [`Picture`], written with quick-xml's writer (it escapes text and attribute
//! values and closes what it opens). Each mark is a `<g>` with a `class` (`beat`, `term`,
//! `lease-expiry`, `candidate`, `two-phase-wait`, `crash`, `reap`, `stop`, `note`,
//! `failover`), the lane's `data-instance`, and a `<title>` that a browser shows on hover.

use std::fmt::Display;
use std::io;
use std::time::Duration;

use quick_xml::events::{BytesDecl, BytesText, Event as Xml};
use quick_xml::Writer;

use super::{Lane, Picture, Term, POLL};

const WIDTH: f64 = 1120.0;
/// Left margin: the lanes' labels.
const LEFT: f64 = 96.0;
const RIGHT: f64 = 24.0;
/// Above the first lane: the title, two lines of explanation, two rows of Redis notes.
const TOP: f64 = 100.0;
const LANE_H: f64 = 100.0;
/// The life line's height within a lane.
const LIFE: f64 = 50.0;
/// The leadership bar's top within a lane.
const BAR: f64 = 68.0;
const AXIS_H: f64 = 40.0;
const LEGEND_ROW: f64 = 22.0;
/// Average width of a character at 12 px (layout estimate only).
const CHAR_W: f64 = 6.0;

const BEAT: &str = "#1f77b4";
const TERM: &str = "#2ca02c";
const CANDIDATE: &str = "#e69f00";
const WAIT_TEXT: &str = "#8a5a00";
const CRASH: &str = "#d62728";
const REAP: &str = "#6a3d9a";
const REDIS: &str = "#0099aa";
const GREY: &str = "#888888";

type W = Writer<Vec<u8>>;

/// An element with its attributes, written once.
struct Tag {
    name: &'static str,
    attrs: Vec<(&'static str, String)>,
}

fn tag(name: &'static str) -> Tag {
    Tag {
        name,
        attrs: Vec::new(),
    }
}

impl Tag {
    fn at(mut self, key: &'static str, value: impl Display) -> Tag {
        self.attrs.push((key, value.to_string()));
        self
    }

    /// A coordinate or length, to 0.1 px.
    fn px(self, key: &'static str, value: f64) -> Tag {
        self.at(key, format!("{value:.1}"))
    }

    fn empty(self, w: &mut W) -> io::Result<()> {
        w.create_element(self.name)
            .with_attributes(self.attrs.iter().map(|(k, v)| (*k, v.as_str())))
            .write_empty()?;
        Ok(())
    }

    fn text(self, w: &mut W, text: &str) -> io::Result<()> {
        w.create_element(self.name)
            .with_attributes(self.attrs.iter().map(|(k, v)| (*k, v.as_str())))
            .write_text_content(BytesText::new(text))?;
        Ok(())
    }

    fn with(self, w: &mut W, inner: impl FnOnce(&mut W) -> io::Result<()>) -> io::Result<()> {
        w.create_element(self.name)
            .with_attributes(self.attrs.iter().map(|(k, v)| (*k, v.as_str())))
            .write_inner_content(inner)?;
        Ok(())
    }
}

/// A `<text>` at (x, y).
fn label(x: f64, y: f64) -> Tag {
    tag("text").px("x", x).px("y", y)
}

/// A mark: `<g class=.. data-instance=..><title>..</title>body</g>`.
fn mark(
    w: &mut W,
    class: &str,
    instance: &str,
    title: &str,
    body: impl FnOnce(&mut W) -> io::Result<()>,
) -> io::Result<()> {
    tag("g")
        .at("class", class)
        .at("data-instance", instance)
        .with(w, |w| {
            tag("title").text(w, title)?;
            body(w)
        })
}

/// Seconds since the demo started -> x.
struct Scale {
    end: f64,
}

impl Scale {
    fn x(&self, t: Duration) -> f64 {
        LEFT + t.as_secs_f64() / self.end * (WIDTH - LEFT - RIGHT)
    }

    /// A label anchored so that it stays inside the picture: `(anchor, dx)` for a label next
    /// to a mark at `x`.
    fn side(x: f64) -> (&'static str, f64) {
        if x > WIDTH * 0.62 {
            ("end", -10.0)
        } else {
            ("start", 10.0)
        }
    }
}

fn stamp(t: Duration) -> String {
    format!("+{:.3} s", t.as_secs_f64())
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// The whole picture.
pub(super) fn svg(p: &Picture) -> io::Result<Vec<u8>> {
    let items = legend_items(p);
    let (_, rows) = legend_layout(&items);
    let lanes_h = LANE_H * p.lanes.len() as f64;
    let axis_y = TOP + lanes_h + 8.0;
    let legend_y = axis_y + AXIS_H;
    let height = legend_y + rows as f64 * LEGEND_ROW + 8.0;
    let scale = Scale {
        end: p.end.as_secs_f64(),
    };
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 1);
    w.write_event(Xml::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
    tag("svg")
        .at("xmlns", "http://www.w3.org/2000/svg")
        .px("width", WIDTH)
        .px("height", height)
        .at("viewBox", format!("0 0 {WIDTH:.0} {height:.0}"))
        .at("font-family", "sans-serif")
        .at("font-size", 12)
        .with(&mut w, |w| {
            tag("title").text(w, "sfu-redis demo: one lane per instance on a time axis")?;
            tag("rect")
                .at("width", "100%")
                .at("height", "100%")
                .at("fill", "#ffffff")
                .empty(w)?;
            header(w, p)?;
            for (i, lane) in p.lanes.iter().enumerate() {
                draw_lane(w, &scale, lane, TOP + LANE_H * i as f64, i % 2 == 1)?;
            }
            redis_notes(w, p, &scale, TOP + lanes_h)?;
            axis(w, &scale, axis_y)?;
            legend(w, &items, legend_y)
        })?;
    Ok(w.into_inner())
}

fn header(w: &mut W, p: &Picture) -> io::Result<()> {
    let t = p.timings;
    label(12.0, 24.0)
        .at("font-size", 16)
        .at("font-weight", "bold")
        .text(
            w,
            &format!(
                "sfu-redis demo: {} instances share one Redis ({:.1} s)",
                p.lanes.len(),
                p.end.as_secs_f64()
            ),
        )?;
    label(12.0, 44.0).at("fill", "#444444").text(
        w,
        &format!(
            "Timings::fast(): heartbeat every {} (TTL {}), stale after {}, lease {} refreshed every {}, two-phase delay {}, reap round every {}",
            ms(t.heartbeat_interval),
            ms(t.heartbeat_ttl),
            ms(t.stale_threshold),
            ms(t.lease_ttl),
            ms(t.lease_refresh),
            ms(t.two_phase_delay),
            ms(t.reap_interval)
        ),
    )?;
    let unseen = match p.unseen {
        0 => "every heartbeat's time was seen".to_owned(),
        n => format!("{n} heartbeats between two polls have no known time and are not drawn"),
    };
    label(12.0, 62.0).at("fill", "#444444").text(
        w,
        &format!(
            "Ticks: heartbeats when they succeeded (each node's stats polled every {} at most); {unseen}. Hover a mark for its details.",
            ms(POLL)
        ),
    )
}

fn draw_lane(w: &mut W, sc: &Scale, lane: &Lane, y0: f64, shaded: bool) -> io::Result<()> {
    tag("g")
        .at("class", "lane")
        .at("data-instance", &lane.id)
        .with(w, |w| {
            tag("rect")
                .px("x", 0.0)
                .px("y", y0)
                .px("width", WIDTH)
                .px("height", LANE_H)
                .at("fill", if shaded { "#f5f7fa" } else { "#ffffff" })
                .empty(w)?;
            label(12.0, y0 + LIFE + 5.0)
                .at("font-size", 15)
                .at("font-weight", "bold")
                .text(w, &lane.id)?;
            life_line(w, sc, lane, y0)?;
            for term in &lane.terms {
                draw_term(w, sc, &lane.id, term, y0)?;
            }
            if let Some(wait) = lane.wait {
                draw_wait(w, sc, &lane.id, wait, y0)?;
            }
            draw_beats(w, sc, lane, y0)?;
            for (at, by) in &lane.candidates {
                let title = format!(
                    "{}: candidates event of {by}: {} is stale (phase one: suspected, not yet dead)",
                    stamp(*at),
                    lane.id
                );
                mark(w, "candidate", &lane.id, &title, |w| {
                    diamond(w, sc.x(*at), y0 + LIFE)
                })?;
            }
            draw_crash_and_reap(w, sc, lane, y0)?;
            draw_stop_and_notes(w, sc, lane, y0)
        })
}

/// Grey while alive, dashed red from its crash to its reap (or the end).
fn life_line(w: &mut W, sc: &Scale, lane: &Lane, y0: f64) -> io::Result<()> {
    let end = sc.end_time();
    let alive_to = lane.crash.or(lane.stopped).unwrap_or(end);
    hline(sc.x(lane.start()), sc.x(alive_to), y0 + LIFE)
        .at("stroke", GREY)
        .empty(w)?;
    if let Some(crash) = lane.crash {
        let to = lane.reaped.as_ref().map_or(end, |r| r.at);
        hline(sc.x(crash), sc.x(to), y0 + LIFE)
            .at("stroke", CRASH)
            .at("stroke-opacity", 0.6)
            .at("stroke-dasharray", "4 3")
            .empty(w)?;
    }
    Ok(())
}

impl Scale {
    fn end_time(&self) -> Duration {
        Duration::from_secs_f64(self.end)
    }
}

fn hline(x1: f64, x2: f64, y: f64) -> Tag {
    tag("line")
        .px("x1", x1)
        .px("y1", y)
        .px("x2", x2.max(x1))
        .px("y2", y)
}

fn draw_term(w: &mut W, sc: &Scale, id: &str, t: &Term, y0: f64) -> io::Result<()> {
    let (x1, x2) = (sc.x(t.from), sc.x(t.to));
    let title = format!(
        "{id} led, epoch {} (the fencing token), from {} to {} ({})",
        t.epoch,
        stamp(t.from),
        stamp(t.to),
        t.ended
    );
    let text = format!("leader, epoch {}", t.epoch);
    mark(w, "term", id, &title, |w| {
        bar(w, x1, x2, y0 + BAR)?;
        let fits = x2 - x1 > text.len() as f64 * CHAR_W + 8.0;
        let (x, fill) = if fits {
            (x1 + 5.0, "#ffffff")
        } else {
            (x2 + 4.0, TERM)
        };
        label(x, y0 + BAR + 11.0)
            .at("font-size", 11)
            .at("fill", fill)
            .text(w, &text)
    })?;
    if let Some(until) = t.lease_until {
        let title = format!(
            "the lease {id} held stayed in Redis until its TTL ran out at about {}: nobody could lead meanwhile",
            stamp(until)
        );
        mark(w, "lease-expiry", id, &title, |w| {
            lease_box(w, x2, sc.x(until), y0 + BAR)
        })?;
    }
    Ok(())
}

fn bar(w: &mut W, x1: f64, x2: f64, y: f64) -> io::Result<()> {
    tag("rect")
        .px("x", x1)
        .px("y", y)
        .px("width", (x2 - x1).max(1.0))
        .px("height", 15.0)
        .at("rx", 2)
        .at("fill", TERM)
        .empty(w)
}

fn lease_box(w: &mut W, x1: f64, x2: f64, y: f64) -> io::Result<()> {
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

fn draw_wait(
    w: &mut W,
    sc: &Scale,
    id: &str,
    (from, to): (Duration, Duration),
    y0: f64,
) -> io::Result<()> {
    let (x1, x2) = (sc.x(from), sc.x(to));
    let took = to.saturating_sub(from);
    let title = format!(
        "two-phase wait: named a candidate at {}, re-checked and reaped at {} ({})",
        stamp(from),
        stamp(to),
        ms(took)
    );
    mark(w, "two-phase-wait", id, &title, |w| {
        wait_box(w, x1, x2, y0 + LIFE - 10.0)?;
        label((x1 + x2) / 2.0, y0 + 36.0)
            .at("text-anchor", "middle")
            .at("font-size", 11)
            .at("fill", WAIT_TEXT)
            .text(w, &format!("two-phase wait {:.2} s", took.as_secs_f64()))
    })
}

fn wait_box(w: &mut W, x1: f64, x2: f64, y: f64) -> io::Result<()> {
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

fn draw_beats(w: &mut W, sc: &Scale, lane: &Lane, y0: f64) -> io::Result<()> {
    for at in &lane.beats {
        let title = format!("{}: heartbeat of {}", stamp(*at), lane.id);
        mark(w, "beat", &lane.id, &title, |w| {
            tick(w, sc.x(*at), y0 + LIFE)
        })?;
    }
    Ok(())
}

fn tick(w: &mut W, x: f64, y: f64) -> io::Result<()> {
    tag("line")
        .px("x1", x)
        .px("y1", y - 8.0)
        .px("x2", x)
        .px("y2", y + 8.0)
        .at("stroke", BEAT)
        .at("stroke-width", 1.5)
        .empty(w)
}

fn diamond(w: &mut W, x: f64, y: f64) -> io::Result<()> {
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

fn cross(w: &mut W, x: f64, y: f64) -> io::Result<()> {
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

fn square(w: &mut W, x: f64, y: f64) -> io::Result<()> {
    tag("rect")
        .px("x", x - 6.0)
        .px("y", y - 6.0)
        .px("width", 12.0)
        .px("height", 12.0)
        .at("fill", REAP)
        .empty(w)
}

fn draw_crash_and_reap(w: &mut W, sc: &Scale, lane: &Lane, y0: f64) -> io::Result<()> {
    let id = &lane.id;
    if let Some(at) = lane.crash {
        let title = format!(
            "{}: {id} crashed (threads stopped, nothing cleaned up, as kill -9 would)",
            stamp(at)
        );
        mark(w, "crash", id, &title, |w| {
            let x = sc.x(at);
            cross(w, x, y0 + LIFE)?;
            label(x, y0 + 22.0)
                .at("text-anchor", "middle")
                .at("font-weight", "bold")
                .at("fill", CRASH)
                .text(w, "crash")
        })?;
    }
    if let Some(r) = &lane.reaped {
        let text = format!(
            "reaped by {}: {} rooms, {} peers{}",
            r.by,
            r.rooms,
            r.peers,
            match r.skipped_rooms {
                0 => String::new(),
                n => format!(", {n} rooms left to their new owner"),
            }
        );
        let title = format!(
            "{}: {text} (owner-CAS scripts: only what {id} still owned)",
            stamp(r.at)
        );
        mark(w, "reap", id, &title, |w| {
            let x = sc.x(r.at);
            square(w, x, y0 + LIFE)?;
            let (anchor, dx) = Scale::side(x);
            label(x + dx, y0 + 22.0)
                .at("text-anchor", anchor)
                .at("font-weight", "bold")
                .at("fill", REAP)
                .text(w, &text)
        })?;
    }
    Ok(())
}

fn draw_stop_and_notes(w: &mut W, sc: &Scale, lane: &Lane, y0: f64) -> io::Result<()> {
    let id = &lane.id;
    if let Some(at) = lane.stopped {
        let title = format!("{}: {id} shut down (stopped event)", stamp(at));
        mark(w, "stop", id, &title, |w| {
            let x = sc.x(at);
            tag("line")
                .px("x1", x)
                .px("y1", y0 + LIFE - 10.0)
                .px("x2", x)
                .px("y2", y0 + LIFE + 10.0)
                .at("stroke", GREY)
                .at("stroke-width", 3)
                .empty(w)?;
            label(x - 6.0, y0 + 36.0)
                .at("text-anchor", "end")
                .at("font-size", 11)
                .at("fill", GREY)
                .text(w, "shut down")
        })?;
    }
    for (at, text) in &lane.notes {
        let title = format!("{}: {text}", stamp(*at));
        mark(w, "note", id, &title, |w| dot(w, sc.x(*at), y0 + LIFE))?;
    }
    Ok(())
}

fn dot(w: &mut W, x: f64, y: f64) -> io::Result<()> {
    tag("circle")
        .px("cx", x)
        .px("cy", y)
        .px("r", 5.0)
        .at("fill", "#ffffff")
        .at("stroke", REDIS)
        .at("stroke-width", 2)
        .empty(w)
}

/// The demo's notes about Redis (the failover): dashed lines across every lane, labelled
/// above the first, on two alternating rows.
fn redis_notes(w: &mut W, p: &Picture, sc: &Scale, bottom: f64) -> io::Result<()> {
    for (i, (at, text)) in p.redis.iter().enumerate() {
        let x = sc.x(*at);
        let y = if i % 2 == 0 { TOP - 22.0 } else { TOP - 8.0 };
        let title = format!("{}: {text}", stamp(*at));
        mark(w, "failover", "redis", &title, |w| {
            vline(w, x, y + 3.0, bottom)?;
            let (anchor, dx) = Scale::side(x);
            label(x + dx / 2.0, y)
                .at("text-anchor", anchor)
                .at("font-size", 11)
                .at("fill", REDIS)
                .text(w, text)
        })?;
    }
    Ok(())
}

fn vline(w: &mut W, x: f64, y1: f64, y2: f64) -> io::Result<()> {
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

/// The time axis: a tick every 1, 2, 5, 10... s, at most 15 of them.
fn axis(w: &mut W, sc: &Scale, y: f64) -> io::Result<()> {
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0]
        .into_iter()
        .find(|s| sc.end / s <= 15.0)
        .unwrap_or(600.0);
    tag("g").at("class", "axis").with(w, |w| {
        hline(LEFT, WIDTH - RIGHT, y)
            .at("stroke", "#333333")
            .empty(w)?;
        let mut t = 0.0;
        while t <= sc.end + 1e-9 {
            let x = sc.x(Duration::from_secs_f64(t));
            tag("line")
                .px("x1", x)
                .px("y1", y)
                .px("x2", x)
                .px("y2", y + 5.0)
                .at("stroke", "#333333")
                .empty(w)?;
            label(x, y + 18.0)
                .at("text-anchor", "middle")
                .text(w, &format!("{t:.0} s"))?;
            t += step;
        }
        label(LEFT - 20.0, y + 18.0)
            .at("text-anchor", "end")
            .at("fill", "#444444")
            .text(w, "time")
    })
}

/// A legend entry: the mark's class and what it means.
type Item = (&'static str, &'static str);

fn legend_items(p: &Picture) -> Vec<Item> {
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
fn legend_layout(items: &[Item]) -> (Vec<(f64, usize)>, usize) {
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

fn legend(w: &mut W, items: &[Item], y: f64) -> io::Result<()> {
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

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

mod lanes;
mod legend;
mod shapes;

use lanes::draw_lane;
use legend::{legend, legend_items, legend_layout};
use shapes::vline;

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
            "Ticks: heartbeats when they succeeded (each node's stats, polled in the demo's waits every {} at most); {unseen}. Hover a mark for its details.",
            ms(POLL)
        ),
    )
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

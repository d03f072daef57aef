//! One instance's lane: life line, leadership terms, the two-phase wait, heartbeat ticks,
//! candidates, crash, reap, shutdown and notes.

use super::shapes::*;
use super::*;

pub(super) fn draw_lane(
    w: &mut W,
    sc: &Scale,
    lane: &Lane,
    y0: f64,
    shaded: bool,
) -> io::Result<()> {
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

fn draw_beats(w: &mut W, sc: &Scale, lane: &Lane, y0: f64) -> io::Result<()> {
    for at in &lane.beats {
        let title = format!("{}: heartbeat of {}", stamp(*at), lane.id);
        mark(w, "beat", &lane.id, &title, |w| {
            tick(w, sc.x(*at), y0 + LIFE)
        })?;
    }
    Ok(())
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

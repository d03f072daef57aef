//! The demo's report: stop the collectors, print the timeline and the checks.

use super::*;

impl Demo {
    /// Shuts down every live node (the survivor releases the lease and emits `stopped`), then
    /// collects the last events.
    pub(super) fn finish(&mut self) {
        self.sample_beats();
        for m in &self.members {
            if !m.crashed {
                if let Err(e) = m.node.shutdown() {
                    log::warn!("shutdown of {}: {e}", m.id);
                }
            }
        }
        // Every event is emitted by now: let the collectors drain and stop.
        self.stop_collectors = None;
        for h in self.collectors.drain(..) {
            if h.join().is_err() {
                log::error!("an event collector panicked");
            }
        }
        self.tx = None;
        self.pump();
        self.restamp();
        self.trace.ended(self.elapsed());
        self.members.clear();
    }

    /// Gives every event of the timeline the time its node emitted it (`Node::emitted`) instead
    /// of the time the demo's collector received it, so that the timeline and the picture show
    /// what the nodes did when they did it (a collector descheduled on a busy machine once
    /// shrank a drawn two-phase wait below the delay). A node's events arrive in the order it
    /// emitted them, so they are matched from the last one back (its history keeps only the
    /// last `EMITTED_HISTORY`; an event it lacks keeps its arrival stamp).
    fn restamp(&mut self) {
        for m in &self.members {
            let emitted = m.node.emitted();
            let mut left = emitted.len();
            for e in self.entries.iter_mut().rev().filter(|e| e.instance == m.id) {
                let What::Event(ev) = &e.what else {
                    continue;
                };
                if let Some(k) = emitted[..left].iter().rposition(|h| &h.event == ev) {
                    e.at = emitted[k].at.saturating_duration_since(self.start);
                    left = k;
                }
            }
        }
    }

    pub(super) fn print_timeline(&mut self) {
        let letter = self.next_letter();
        out!("\n[{letter}] timeline (time since the demo started, instance, event, fields)");
        let mut sorted: Vec<&Entry> = self.entries.iter().collect();
        sorted.sort_by_key(|e| e.at);
        for e in sorted {
            let (name, fields) = match &e.what {
                What::Event(ev) => (ev.name(), event_fields(ev)),
                What::Note(note) => ("", note.clone()),
            };
            let line = format!(
                "  {}  {:<5}  {:<16} {fields}",
                stamp(e.at),
                e.instance,
                name
            );
            out!("{}", line.trim_end());
        }
    }

    pub(super) fn print_check(&self, i: usize) {
        let c = &self.checks[i];
        if c.ok {
            out!("  PASS  {} ({})", c.name, c.detail);
        } else {
            out!("  FAIL  {}: {}", c.name, c.detail);
        }
    }

    pub(super) fn print_checks(&mut self) {
        let letter = self.next_letter();
        let on = match (self.redis.master_name(), self.redis.route().master) {
            (Some(_), Some(master)) => format!(" on master {master}"),
            _ => String::new(),
        };
        out!(
            "\n[{letter}] checks (read back from Redis{on} with SCAN MATCH {})",
            self.keys.scan_pattern()
        );
        for i in 0..self.checks.len() {
            self.print_check(i);
        }
    }
}

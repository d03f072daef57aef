//! Progress of a long command (`fsck`, `reap`) on stderr, so `--json` on stdout stays clean:
//! an `indicatif` bar with counts and rate when stderr is a terminal, else plain lines with no
//! escape codes (logs, pipes): the first update, then at most one line every
//! [`PLAIN_EVERY`], then a last line when the command ends.

use std::cell::{Cell, RefCell};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Most one plain line per this long (besides the first and the last).
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(2);

/// One progress display: `what` (`fsck`, `reap`) counts `unit`s (`keys`, `rooms`).
pub(crate) struct Progress {
    what: &'static str,
    /// When the current count began (the rate's start).
    started: Cell<Instant>,
    done: Cell<u64>,
    view: View,
}

enum View {
    Bar(ProgressBar),
    Plain {
        last: Cell<Option<Instant>>,
        /// The last state not printed yet (printed by [`Progress::finish`]).
        pending: RefCell<Option<String>>,
        /// The status of the last line printed: the same status is not printed twice.
        printed: RefCell<String>,
    },
}

impl Progress {
    /// A bar when stderr is a terminal, plain lines otherwise. `total`: the count expected
    /// (a bar with a length), `None` for a spinner.
    pub(crate) fn new(what: &'static str, total: Option<u64>) -> Progress {
        let view = if std::io::stderr().is_terminal() {
            View::Bar(bar(total))
        } else {
            View::Plain {
                last: Cell::new(None),
                pending: RefCell::new(None),
                printed: RefCell::new(String::new()),
            }
        };
        Progress {
            what,
            started: Cell::new(Instant::now()),
            done: Cell::new(0),
            view,
        }
    }

    /// Reports `done` units (`None`: unchanged; a count lower than the last one starts a new
    /// count and rate, e.g. a second scan) and a short status (`scan 1: 1200 keys`): the bar
    /// is redrawn (at indicatif's rate), a plain line printed when [`PLAIN_EVERY`] has passed.
    pub(crate) fn update(&self, done: Option<u64>, status: &str) {
        let restart = done.is_some_and(|d| d < self.done.get());
        if restart {
            self.started.set(Instant::now());
        }
        if let Some(d) = done {
            self.done.set(d);
        }
        match &self.view {
            View::Bar(bar) => {
                if restart {
                    bar.reset();
                }
                bar.set_position(self.done.get());
                bar.set_message(status.to_owned());
            }
            View::Plain {
                last,
                pending,
                printed,
            } => {
                // A new count or a step without one (a new phase): the last state of the
                // previous one is printed first, so its final count shows.
                if restart || done.is_none() {
                    if let Some(line) = pending.borrow_mut().take() {
                        plain(&line);
                    }
                }
                if *printed.borrow() == status {
                    // Nothing new (a phase that ended where the last one did).
                    *pending.borrow_mut() = None;
                    return;
                }
                let line = self.line(status);
                let now = Instant::now();
                if last
                    .get()
                    .map_or(true, |t| now.duration_since(t) >= PLAIN_EVERY)
                {
                    last.set(Some(now));
                    plain(&line);
                    *pending.borrow_mut() = None;
                    *printed.borrow_mut() = status.to_owned();
                } else {
                    *pending.borrow_mut() = Some(line);
                }
            }
        }
    }

    /// Ends the display: the bar is cleared; in plain mode the last status not yet printed
    /// is printed.
    pub(crate) fn finish(&self) {
        match &self.view {
            View::Bar(bar) => bar.finish_and_clear(),
            View::Plain { pending, .. } => {
                if let Some(line) = pending.borrow_mut().take() {
                    plain(&line);
                }
            }
        }
    }

    /// `fsck: scan 1: 1200 keys (850/s)`; the rate is `-` in the first 200 ms of a count (a
    /// count over a few microseconds is no rate).
    fn line(&self, status: &str) -> String {
        let secs = self.started.get().elapsed().as_secs_f64();
        if secs < 0.2 {
            return format!("{}: {status} (-/s)", self.what);
        }
        let rate = self.done.get() as f64 / secs;
        format!("{}: {status} ({rate:.0}/s)", self.what)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let View::Bar(bar) = &self.view {
            if !bar.is_finished() {
                bar.finish_and_clear();
            }
        }
    }
}

fn plain(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The terminal bar: `[elapsed] [bar] pos/len rate message`, or a spinner without a length.
fn bar(total: Option<u64>) -> ProgressBar {
    let (bar, template) = match total {
        Some(len) => (
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr()),
            "{elapsed_precise} [{wide_bar}] {pos}/{len} ({per_sec}) {msg}",
        ),
        None => (
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            "{elapsed_precise} {spinner} {pos} ({per_sec}) {msg}",
        ),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

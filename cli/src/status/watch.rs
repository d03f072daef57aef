//! `sfu-redis status --watch`: the table of `status`, every second, until interrupted.
//!
//! On a terminal the screen is cleared and the table redrawn in place; otherwise (a pipe, a
//! log file) each table is printed after the previous one, separated by a blank line, with no
//! escape codes. Redis going away does not end the watch: the line `Redis unreachable since
//! <UTC time>: <error>` is shown instead of the table until Redis answers again.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use super::{print_table, Outage, Source};
use crate::Failure;

/// Time between two redraws.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Clear the screen and move the cursor home (ANSI), written before each redraw on a terminal.
const CLEAR: &str = "\x1b[H\x1b[2J";

pub(crate) fn run(src: &Source) -> Result<(), Failure> {
    let terminal = std::io::stdout().is_terminal();
    let mut outage = Outage::default();
    let mut first = true;
    loop {
        let started = Instant::now();
        let read = src.read();
        let down = outage.note(&read);
        let mut frame = Vec::new();
        if terminal {
            frame.extend_from_slice(CLEAR.as_bytes());
        } else if !first {
            frame.push(b'\n');
        }
        first = false;
        let drawn = match (&read, down) {
            (Ok(status), _) => print_table(&mut frame, status),
            (Err(_), Some((_, message))) => writeln!(frame, "{message}"),
            (Err(e), None) => writeln!(frame, "{e}"),
        };
        let mut out = std::io::stdout().lock();
        drawn
            .and_then(|()| out.write_all(&frame))
            .and_then(|()| out.flush())
            .map_err(|e| {
                // A reader that went away (`| head`) ends the watch quietly, as for any filter.
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    std::process::exit(0);
                }
                Failure::runtime(format!("cannot write to stdout: {e}"))
            })?;
        drop(out);
        std::thread::sleep(WATCH_INTERVAL.saturating_sub(started.elapsed()));
    }
}

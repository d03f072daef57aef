//! `sfu-redis status`: the fleet of one prefix as Redis sees it, once (a table or `--json`),
//! every second on a terminal (`--watch`, [`watch`]) or as a live web page (`--serve`,
//! [`serve`]).

mod events;
mod serve;
mod watch;

use std::io::Write;
use std::time::Duration;

use clap::Args;
use sfu_redis::ops::status::{fleet_status_with_stale, FleetStatus, InstanceStatus};
use sfu_redis::Timings;

use crate::{parse_factor, scaled, with_place, Failure, RedisArgs};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Override: judge every instance with stale threshold = this x --stale-factor (1.5 unless
    /// given) instead of its own record's. Not needed: each instance's record carries its
    /// timings.
    #[arg(long, value_name = "MS", value_parser = parse_ttl)]
    heartbeat_ttl_ms: Option<u64>,
    /// Override: stale threshold as a multiple of --heartbeat-ttl-ms (30000 unless given) for
    /// every instance, instead of its own record's.
    #[arg(long, value_name = "FACTOR", value_parser = parse_factor)]
    stale_factor: Option<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long, conflicts_with_all = ["watch", "serve"])]
    json: bool,
    /// Redraw the table every second until interrupted (on a terminal: clear and redraw;
    /// otherwise one table per second, separated by a blank line, no escape codes). Redis
    /// going away is shown as "Redis unreachable since ..." and the watch goes on.
    #[arg(long, conflicts_with = "serve")]
    watch: bool,
    /// Serve the live fleet page on HOST:PORT (a bare PORT binds 127.0.0.1; port 0 picks a
    /// free one): `/` is the page (refreshed every second), `/status.json` the data of
    /// --json plus the recent events of the prefix's events channel, `/fsck.json` a
    /// report-only audit (POST starts one, GET shows the last). Runs until interrupted.
    #[arg(long, value_name = "HOST:PORT")]
    serve: Option<String>,
    /// With --serve: also answer requests whose Host is NAME (repeatable, or comma-separated),
    /// e.g. the name a reverse proxy or DNS gives this host. Without it the page answers only
    /// to localhost and IP addresses; any other Host gets 403 (protection against DNS
    /// rebinding).
    #[arg(
        long,
        value_name = "NAME",
        requires = "serve",
        value_delimiter = ',',
        value_parser = serve::parse_allow_host
    )]
    allow_host: Vec<String>,
}

/// Parses `--heartbeat-ttl-ms`: at least 3 ms (the interval is derived as a third of it).
fn parse_ttl(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(ms) if ms >= 3 => Ok(ms),
        Ok(_) => Err("must be at least 3 (milliseconds)".into()),
        Err(_) => Err(format!("{s:?} is not a whole number of milliseconds")),
    }
}

/// What every mode of `status` reads with: the configuration, the caller's stale-threshold
/// override (if any) and the Redis URL (as given; shown only through `redact_url`).
pub(crate) struct Source {
    pub config: sfu_redis::Config,
    pub stale_override: Option<Duration>,
    pub url: String,
}

impl Source {
    /// One read of the fleet; the error names the URL without its password.
    pub fn read(&self) -> Result<FleetStatus, String> {
        fleet_status_with_stale(&self.config, self.stale_override)
            .map_err(|e| with_place("cannot read the fleet status", Some(&self.url), &e))
    }
}

fn source(args: &StatusArgs) -> Result<Source, Failure> {
    // Each instance is judged with the timings of its own record; the flags override them
    // for every instance (an operator who knows better, or instances without a record).
    let mut override_ms: Option<Duration> = None;
    let mut timings = Timings::default();
    if let Some(ms) = args.heartbeat_ttl_ms {
        // Only the stale threshold (and the call timeout) matter here; the interval is set to
        // a third of the TTL just to keep the timings valid.
        let ttl = Duration::from_millis(ms);
        timings = Timings::from_heartbeat(ttl / 3, ttl);
        timings.command_timeout = Timings::default().command_timeout.min(ttl / 2);
        override_ms = Some(timings.stale_threshold);
    }
    if let Some(f) = args.stale_factor {
        timings.stale_threshold = scaled(timings.heartbeat_ttl, f)?;
        override_ms = Some(timings.stale_threshold);
    }
    let config = args
        .redis
        .builder()
        .timings(timings)
        .build()
        .map_err(|e| Failure::config(&e))?;
    let Some(url) = config.redis_url().map(str::to_owned) else {
        return Err(Failure::usage(
            "status reads the fleet from Redis: pass --redis-url or set REDIS_URL (memory-only mode has no fleet)",
        ));
    };
    Ok(Source {
        config,
        stale_override: override_ms,
        url,
    })
}

pub(crate) fn run(args: StatusArgs) -> Result<(), Failure> {
    let src = source(&args)?;
    if let Some(addr) = &args.serve {
        return serve::run(src, addr, args.allow_host.clone());
    }
    if args.watch {
        return watch::run(&src);
    }
    let status = src.read().map_err(Failure::runtime)?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        writeln!(out, "{}", status.to_json())
    } else {
        print_table(&mut out, &status)
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| Failure::runtime(format!("cannot write to stdout: {e}")))
}

/// Milliseconds since the Unix epoch on this host's clock (0 if the clock is before 1970).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (for "Redis unreachable since ...").
pub(crate) fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's days_from_civil, inverted).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Since when Redis has been unreachable, and why (the last error): kept by the repeating
/// modes, which go on through an outage.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    since_ms: Option<i64>,
}

impl Outage {
    /// Records a read: `Ok` ends an outage; `Err` starts one (or continues it) and returns the
    /// message to show: `Redis unreachable since <UTC time>: <error>`.
    pub fn note<T>(&mut self, read: &Result<T, String>) -> Option<(i64, String)> {
        match read {
            Ok(_) => {
                self.since_ms = None;
                None
            }
            Err(e) => {
                let since = *self.since_ms.get_or_insert_with(now_ms);
                Some((
                    since,
                    format!("Redis unreachable since {}: {e}", utc(since)),
                ))
            }
        }
    }
}

/// A duration in ms for people: `850 ms`, `12.3 s`, `4 min 10 s`, `3 h 02 min`, `2 d 05 h`.
fn human_ms(ms: i64) -> String {
    if ms < 0 {
        return "?".into();
    }
    let s = ms / 1000;
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else if ms < 86_400_000 {
        format!("{} h {:02} min", s / 3600, s % 3600 / 60)
    } else {
        format!("{} d {:02} h", s / 86400, s % 86400 / 3600)
    }
}

/// An id for a table cell: control characters escaped, so garbage cannot break the layout.
fn cell(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The human status: a header (prefix, leader, epoch, lease TTL, where the stale thresholds
/// come from and what the states mean), the problems and warnings of the fleet, one row per
/// instance, then the problems of each instance.
pub(crate) fn print_table(out: &mut impl Write, st: &FleetStatus) -> std::io::Result<()> {
    writeln!(out, "prefix     {}", st.prefix)?;
    if !st.route.url.is_empty() {
        let via = match (&st.route.master_name, &st.route.master) {
            (Some(name), Some(master)) => format!(
                ", master {master} of {name:?} via {}",
                st.route
                    .sentinel
                    .as_deref()
                    .map(|s| format!("sentinel {s}"))
                    .unwrap_or_else(|| "the last known master (no sentinel answered)".into())
            ),
            _ if !st.route.masters.is_empty() => format!(
                ", {} masters {}, control plane on {}",
                st.route.masters.len(),
                st.route.masters.join(" "),
                st.route.ctl_master.as_deref().unwrap_or("no master")
            ),
            _ => String::new(),
        };
        writeln!(
            out,
            "redis      {} ({}{via}, {} replica(s))",
            st.route.url, st.route.transport, st.route.replicas
        )?;
    }
    match &st.schema {
        Some(v) => writeln!(out, "schema     key schema version {}", cell(v))?,
        None => writeln!(
            out,
            "schema     no stamp (layout version 1: written before versions, or no node registered yet)"
        )?,
    }
    let epoch = if st.epoch_known {
        st.epoch.to_string()
    } else {
        "unknown".to_owned()
    };
    let dead = if st.leader_alive {
        ""
    } else {
        " (not heartbeating)"
    };
    match (&st.leader, st.leader_ttl_ms) {
        (Some(leader), Some(ttl)) => writeln!(
            out,
            "leader     {}{dead} (epoch {epoch}, lease expires in {ttl} ms)",
            cell(leader)
        )?,
        (Some(leader), None) => writeln!(
            out,
            "leader     {}{dead} (epoch {epoch}, lease has no TTL!)",
            cell(leader)
        )?,
        (None, _) => {
            writeln!(out, "leader     none (last epoch {epoch})")?;
            if let Some(note) = &st.leader_note {
                writeln!(out, "           {}", cell(note))?;
            }
        }
    }
    // The leader skips its reap rounds: stale instances wait meanwhile.
    if let Some(note) = &st.reaper_note {
        writeln!(out, "           {}", cell(note))?;
    }
    if st.stale_override {
        writeln!(
            out,
            "stale      after {} ms without a heartbeat, for every instance (set by --heartbeat-ttl-ms / --stale-factor)",
            st.stale_threshold_ms
        )?;
    } else {
        writeln!(
            out,
            "stale      each instance's own threshold (its record's: column STALE AFTER); {} ms for one without a record; --heartbeat-ttl-ms / --stale-factor override it for all",
            st.stale_threshold_ms
        )?;
    }
    writeln!(
        out,
        "states     alive: heartbeating; stopped: stopped cleanly, not heartbeating; late: heartbeat key expired, not stale yet; stale: a reap candidate; being_reaped: a leader is removing it"
    )?;
    for p in &st.problems {
        writeln!(out, "problem    {}", cell(p))?;
    }
    for w in &st.warnings {
        writeln!(out, "warning    {}", cell(w))?;
    }
    writeln!(out, "instances  {}", st.instances.len())?;
    if st.instances.is_empty() {
        if st.other_prefixes.is_empty() {
            writeln!(
                out,
                "hint       no fleet under this prefix, and none found under another (is this the Redis the fleet uses?)"
            )?;
        } else {
            writeln!(
                out,
                "hint       no fleet under this prefix; fleets found under: {} (check --namespace / --stage / --branch)",
                cell(&st.other_prefixes.join(", "))
            )?;
        }
        return Ok(());
    }
    let header = [
        "INSTANCE",
        "HEARTBEAT AGE",
        "STALE AFTER",
        "STATE",
        "ROOMS",
        "PEERS",
        "VERSION",
        "HOST",
        "UPTIME",
    ];
    let count = |known: bool, n: u64| if known { n.to_string() } else { "?".to_owned() };
    let text = |v: Option<&String>| v.map(|v| cell(v)).unwrap_or_else(|| "-".into());
    let rows: Vec<[String; 9]> = st
        .instances
        .iter()
        .map(|i| {
            [
                cell(&i.id),
                if i.being_reaped {
                    "-".to_owned()
                } else if i.age_ms < 0 {
                    // A score ahead of the server time (garbage, flagged in the problems).
                    "?".to_owned()
                } else {
                    format!("{} ms", i.age_ms)
                },
                format!("{} ms", i.stale_threshold_ms),
                i.state.as_str().to_owned(),
                count(i.rooms_known, i.rooms),
                count(i.peers_known, i.peers),
                text(i.info.as_ref().and_then(|r| r.version.as_ref())),
                text(i.info.as_ref().and_then(|r| r.host.as_ref())),
                i.uptime_ms.map_or_else(|| "-".into(), human_ms),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    writeln!(out)?;
    // Left-aligned: instance, state, version, host; the rest (numbers) right-aligned.
    let left = [true, false, false, true, false, false, true, true, false];
    let line = |cells: [&str; 9]| {
        cells
            .iter()
            .zip(width)
            .zip(left)
            .map(|((c, w), l)| {
                if l {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    writeln!(out, "{}", line(header).trim_end())?;
    for row in &rows {
        writeln!(
            out,
            "{}",
            line(row.each_ref().map(String::as_str)).trim_end()
        )?;
    }
    let flagged: Vec<&InstanceStatus> = st
        .instances
        .iter()
        .filter(|i| !i.problems.is_empty())
        .collect();
    if !flagged.is_empty() {
        writeln!(out)?;
        for i in flagged {
            for p in &i.problems {
                writeln!(out, "problem    {}: {}", cell(&i.id), cell(p))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_civil_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.789.
        assert_eq!(utc(951_827_696_789), "2000-02-29 12:34:56 UTC");
        assert_eq!(utc(4_102_444_799_000), "2099-12-31 23:59:59 UTC");
    }

    #[test]
    fn serve_addresses() {
        use serve::parse_addr;
        assert_eq!(parse_addr("8080").unwrap().to_string(), "127.0.0.1:8080");
        assert_eq!(parse_addr("0.0.0.0:81").unwrap().to_string(), "0.0.0.0:81");
        assert_eq!(parse_addr("[::1]:82").unwrap().to_string(), "[::1]:82");
        assert!(parse_addr("65536").unwrap_err().contains("0 to 65535"));
        assert!(parse_addr("").unwrap_err().contains("HOST:PORT"));
        assert!(parse_addr("localhost").unwrap_err().contains("HOST:PORT"));
    }
}

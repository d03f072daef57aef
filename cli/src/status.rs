//! `sfu-redis status`: the fleet of one prefix as Redis sees it.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use sfu_redis::status::{fleet_status, FleetStatus, InstanceStatus};
use sfu_redis::Timings;

use crate::{parse_factor, scaled, with_place, Failure, RedisArgs};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Heartbeat TTL the fleet runs with [default: 30000]. Must match the fleet's: the states
    /// are judged with stale threshold = this x --stale-factor.
    #[arg(long, value_name = "MS", value_parser = parse_ttl)]
    heartbeat_ttl_ms: Option<u64>,
    /// Stale threshold as a multiple of the heartbeat TTL [default: 1.5]. Must match the
    /// fleet's.
    #[arg(long, value_name = "FACTOR", value_parser = parse_factor)]
    stale_factor: Option<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Parses `--heartbeat-ttl-ms`: at least 3 ms (the interval is derived as a third of it).
fn parse_ttl(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(ms) if ms >= 3 => Ok(ms),
        Ok(_) => Err("must be at least 3 (milliseconds)".into()),
        Err(_) => Err(format!("{s:?} is not a whole number of milliseconds")),
    }
}

pub(crate) fn run(args: StatusArgs) -> Result<(), Failure> {
    let mut timings = Timings::default();
    if let Some(ms) = args.heartbeat_ttl_ms {
        // Only the stale threshold (and the call timeout) matter here; the interval is set to
        // a third of the TTL just to keep the timings valid.
        let ttl = Duration::from_millis(ms);
        timings = Timings::from_heartbeat(ttl / 3, ttl);
        timings.command_timeout = Timings::default().command_timeout.min(ttl / 2);
    }
    if let Some(f) = args.stale_factor {
        timings.stale_threshold = scaled(timings.heartbeat_ttl, f)?;
    }
    let config = args
        .redis
        .builder()
        .timings(timings)
        .build()
        .map_err(|e| Failure::config(&e))?;
    let Some(url) = config.redis_url() else {
        return Err(Failure::usage(
            "status reads the fleet from Redis: pass --redis-url or set REDIS_URL (memory-only mode has no fleet)",
        ));
    };
    let status = fleet_status(&config)
        .map_err(|e| Failure::runtime(with_place("cannot read the fleet status", Some(url), &e)))?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        writeln!(out, "{}", status.to_json())
    } else {
        print_table(
            &mut out,
            &status,
            timings.heartbeat_ttl,
            Some("--heartbeat-ttl-ms / --stale-factor"),
        )
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| Failure::runtime(format!("cannot write to stdout: {e}")))
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

/// The human status: a header (prefix, leader, epoch, lease TTL, the stale threshold and what
/// the states mean), the problems of the control keys, one row per instance, then the
/// problems of each instance. `heartbeat_ttl` is the TTL the threshold was derived from;
/// `flags` names the flags that set it (`status`), `None` when they do not apply (`demo`).
pub(crate) fn print_table(
    out: &mut impl Write,
    st: &FleetStatus,
    heartbeat_ttl: Duration,
    flags: Option<&str>,
) -> std::io::Result<()> {
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
        (None, _) => writeln!(out, "leader     none (last epoch {epoch})")?,
    }
    let ttl_ms = heartbeat_ttl.as_millis();
    let factor = if ttl_ms == 0 {
        0.0
    } else {
        st.stale_threshold_ms as f64 / ttl_ms as f64
    };
    writeln!(
        out,
        "stale      after {} ms without a heartbeat (heartbeat TTL {ttl_ms} ms x stale factor {factor})",
        st.stale_threshold_ms
    )?;
    if let Some(flags) = flags {
        writeln!(
            out,
            "           the fleet's own timings must be used: pass {flags} if it does not run the defaults"
        )?;
    }
    writeln!(
        out,
        "states     alive: heartbeating; late: heartbeat key expired, not stale yet; stale: a reap candidate; being_reaped: a leader is removing it"
    )?;
    for p in &st.problems {
        writeln!(out, "problem    {}", cell(p))?;
    }
    writeln!(out, "instances  {}", st.instances.len())?;
    if st.instances.is_empty() {
        return Ok(());
    }
    let header = ["INSTANCE", "HEARTBEAT AGE", "STATE", "ROOMS", "PEERS"];
    let count = |known: bool, n: u64| if known { n.to_string() } else { "?".to_owned() };
    let rows: Vec<[String; 5]> = st
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
                i.state.as_str().to_owned(),
                count(i.rooms_known, i.rooms),
                count(i.peers_known, i.peers),
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
    let line = |cells: [&str; 5]| {
        format!(
            "{:<w0$}  {:>w1$}  {:<w2$}  {:>w3$}  {:>w4$}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3],
            w4 = width[4],
        )
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

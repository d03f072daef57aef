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
    /// Heartbeat TTL the fleet runs with (for the stale threshold) [default: 30000].
    #[arg(long, value_name = "MS", value_parser = parse_ttl)]
    heartbeat_ttl_ms: Option<u64>,
    /// Stale threshold as a multiple of the heartbeat TTL [default: 1.5].
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
        print_table(&mut out, &status, timings.stale_threshold)
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| Failure::runtime(format!("cannot write to stdout: {e}")))
}

fn state(i: &InstanceStatus) -> &'static str {
    if i.being_reaped {
        "being reaped"
    } else if i.alive {
        "alive"
    } else {
        "stale"
    }
}

/// The human status: a header (prefix, leader, epoch, lease TTL) and one row per instance.
pub(crate) fn print_table(
    out: &mut impl Write,
    st: &FleetStatus,
    stale_threshold: Duration,
) -> std::io::Result<()> {
    writeln!(out, "prefix     {}", st.prefix)?;
    match (&st.leader, st.leader_ttl_ms) {
        (Some(leader), Some(ttl)) => writeln!(
            out,
            "leader     {leader} (epoch {}, lease expires in {ttl} ms)",
            st.epoch
        )?,
        (Some(leader), None) => writeln!(
            out,
            "leader     {leader} (epoch {}, lease has no TTL!)",
            st.epoch
        )?,
        (None, _) => writeln!(out, "leader     none (last epoch {})", st.epoch)?,
    }
    writeln!(
        out,
        "stale      after {} ms without a heartbeat",
        stale_threshold.as_millis()
    )?;
    writeln!(out, "instances  {}", st.instances.len())?;
    if st.instances.is_empty() {
        return Ok(());
    }
    let header = ["INSTANCE", "HEARTBEAT AGE", "STATE", "ROOMS", "PEERS"];
    let rows: Vec<[String; 5]> = st
        .instances
        .iter()
        .map(|i| {
            [
                i.id.clone(),
                if i.being_reaped {
                    "-".to_owned()
                } else {
                    format!("{} ms", i.age_ms)
                },
                state(i).to_owned(),
                i.rooms.to_string(),
                i.peers.to_string(),
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
    Ok(())
}

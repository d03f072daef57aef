//! `sfu-redis fsck`: audit one prefix's keys against the data model, optionally repairing what
//! is safe to repair while live instances keep running (`sfu_redis::ops::audit`).
//!
//! Exit codes (operators' scripts depend on them): 0 clean or fully repaired, 1 problems
//! remain, 2 error (bad flags, memory-only mode, Redis unreachable or failing).

use std::time::Duration;

use clap::Args;
use sfu_redis::ops::audit::{
    audit_with_progress, AuditOptions, AuditReport, Phase, Progress as AuditProgress,
    DEFAULT_SETTLE,
};
use sfu_redis::{ErrorKind, Timings};

use crate::progress::Progress;
use crate::{with_place, Failure, RedisArgs};

#[derive(Debug, Args)]
pub(crate) struct FsckArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Fix what is safe to fix while nodes keep running (problems seen in both scans only).
    #[arg(long)]
    repair: bool,
    /// Delay between the two scans, ms; a problem must be seen in both. Must be longer than
    /// the command timeout to repair; 0 = one scan, report only. Default: 5000, or longer
    /// when the fleet's records ask for it (the longest heartbeat interval plus command
    /// timeout among the instances, plus 1000: what `forgotten_room` needs).
    #[arg(long, value_name = "MS")]
    settle_ms: Option<u64>,
    /// Timeout of each Redis call, ms (the fleet's command timeout; the settle delay must be
    /// longer).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=30_000))]
    command_timeout_ms: Option<u64>,
    /// Print one JSON object: {"clean", "problems": [{"kind", "key", "detail", "repaired"}], "repaired"}.
    #[arg(long)]
    json: bool,
}

/// The default settle delay for the fleet of `config`: [`DEFAULT_SETTLE`], or the longest
/// heartbeat interval plus command timeout among the instances' records plus 1 s, whichever is
/// longer (a `forgotten_room` needs its owner to have had a full interval to re-pin between
/// the scans). A fleet that cannot be read gets the default (the audit then says why).
pub(crate) fn fleet_settle(config: &sfu_redis::Config) -> Duration {
    let Ok(st) = sfu_redis::ops::status::fleet_status(config) else {
        return DEFAULT_SETTLE;
    };
    st.instances
        .iter()
        .filter_map(|i| {
            let r = i.info.as_ref()?;
            Some(r.heartbeat_interval()? + r.command_timeout()? + Duration::from_secs(1))
        })
        .chain([DEFAULT_SETTLE])
        .max()
        .unwrap_or(DEFAULT_SETTLE)
}

/// An error of `fsck`: always exit 2 (1 means "problems remain").
fn error(message: impl Into<String>) -> Failure {
    Failure::usage(message)
}

pub(crate) fn run(args: FsckArgs) -> Result<(), Failure> {
    let mut timings = Timings::default();
    if let Some(ms) = args.command_timeout_ms {
        timings.command_timeout = Duration::from_millis(ms);
    }
    let config = args
        .redis
        .builder()
        .timings(timings)
        .build()
        .map_err(|e| Failure::config(&e))?;
    let Some(url) = config.redis_url() else {
        return Err(error(
            "fsck audits Redis: pass --redis-url or set REDIS_URL (memory-only mode has nothing to audit)",
        ));
    };
    let settle = match args.settle_ms {
        Some(ms) => Duration::from_millis(ms),
        None => fleet_settle(&config),
    };
    let options = AuditOptions {
        repair: args.repair,
        settle,
    };
    let shown = Progress::new("fsck", None);
    let report = audit_with_progress(&config, &options, &|p| show(&shown, p, settle));
    shown.finish();
    let report = report.map_err(|e| {
        if e.kind() == ErrorKind::InvalidArgument {
            // The settle delay against the command timeout: say which flags set them.
            error(format!(
                "{e} (raise --settle-ms, or pass the fleet's own --command-timeout-ms)"
            ))
        } else {
            error(with_place("cannot audit", Some(url), &e))
        }
    })?;
    if args.json {
        out!("{}", report.to_json());
    } else {
        print_report(&report, args.repair);
    }
    if report.clean() {
        Ok(())
    } else {
        let left = report.remaining().count();
        Err(Failure {
            code: 1,
            message: format!(
                "{left} problem{} remain{} in {}",
                if left == 1 { "" } else { "s" },
                if left == 1 { "s" } else { "" },
                report.prefix
            ),
        })
    }
}

/// One step of the audit on the progress display (stderr): the keys of the current scan.
fn show(shown: &Progress, p: &AuditProgress, settle: Duration) {
    let status = match p.phase {
        Phase::Scanning => format!("scan {}: {} keys", p.scan, p.keys),
        Phase::Checking => format!("scan {}: checking {} keys", p.scan, p.keys),
        Phase::Settling => format!("waiting {} ms before the second scan", settle.as_millis()),
        Phase::Repairing => format!("repairing {} problems", p.problems),
        Phase::Done => format!("done: {} problems", p.problems),
        _ => p.phase.as_str().to_owned(),
    };
    let keys = match p.phase {
        Phase::Scanning | Phase::Checking => Some(p.keys),
        // The last count stays (and the rate, the scan's).
        _ => None,
    };
    shown.update(keys, &status);
}

/// The human report: two lines per problem, then a summary line.
fn print_report(r: &AuditReport, repair: bool) {
    out!("prefix   {}", r.prefix);
    let width = r
        .problems
        .iter()
        .map(|p| p.kind.as_str().len())
        .max()
        .unwrap_or(0);
    for p in &r.problems {
        let mark = if p.repaired { "repaired" } else { "found   " };
        out!("{mark} {:<width$}  {}", p.kind.as_str(), p.key);
        out!("{:9}{:width$}  {}", "", "", p.detail);
    }
    let left = r.remaining().count();
    if r.problems.is_empty() {
        out!("clean: no problems");
    } else if left == 0 {
        out!("clean: {} problems repaired", r.repaired);
    } else if repair {
        out!(
            "{left} problems remain ({} repaired; the others are not safe to repair automatically)",
            r.repaired
        );
    } else {
        let fixable = r.remaining().filter(|p| p.kind.is_repairable()).count();
        out!("{left} problems ({fixable} of a kind --repair can fix)");
    }
}

//! `sfu-redis migrate --dry-run | --apply`: move a prefix's keys to the key schema version
//! this release speaks (`sfu_redis::schema::migrate`).
//!
//! Exit codes (operators' scripts depend on them): 0 the prefix is at this release's version
//! (already, after `--apply`, or a `--dry-run` listed the steps it would take); 1 refused: the
//! prefix is stamped with a version this release does not know (newer, or not a number;
//! nothing written); 2 bad flags, no Redis URL, Redis unreachable or failing.
//!
//! `--json` prints one object: {"prefix", "found", "speaks", "dry_run", "steps": [{"from",
//! "to", "action", "done"}], "version_after"}; `found` is null for an unstamped prefix, and
//! `version_after` is the version the prefix is in when the command ends (null: unstamped).

use clap::Args;
use serde_json::json;
use sfu_redis::schema::{migrate, MigrateReport};
use sfu_redis::ErrorKind;

use crate::{with_place, Failure, RedisArgs};

#[derive(Debug, Args)]
#[group(id = "mode", required = true, multiple = false, args = ["dry_run", "apply"])]
pub(crate) struct MigrateArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// List the steps from the prefix's key schema version to this release's; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Run those steps. Each is safe while nodes keep running (README "Key schema versions").
    #[arg(long)]
    apply: bool,
    /// Print one JSON object: {"prefix", "found", "speaks", "dry_run", "steps", "version_after"}.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: MigrateArgs) -> Result<(), Failure> {
    let config = args
        .redis
        .builder()
        .build()
        .map_err(|e| Failure::config(&e))?;
    let Some(url) = config.redis_url() else {
        return Err(Failure::usage(
            "migrate moves a prefix's keys in Redis: pass --redis-url or set REDIS_URL (memory-only mode has no key schema)",
        ));
    };
    let report = migrate(&config, args.apply).map_err(|e| match e.kind() {
        ErrorKind::Schema => Failure::runtime(e.to_string()),
        _ => Failure::usage(with_place("cannot migrate", Some(url), &e)),
    })?;
    if args.json {
        out!("{}", to_json(&report));
    } else {
        print_report(&report);
    }
    Ok(())
}

/// The version the prefix is in once the command ends, `None` while unstamped.
fn version_after(r: &MigrateReport) -> Option<u32> {
    match r.steps.last() {
        Some(last) if r.applied => Some(last.to),
        _ => r.found.as_deref().and_then(|f| f.parse().ok()),
    }
}

fn to_json(r: &MigrateReport) -> serde_json::Value {
    json!({
        "prefix": r.prefix,
        "found": r.found,
        "speaks": r.speaks,
        "dry_run": !r.applied,
        "steps": r.steps.iter().map(|s| json!({
            "from": s.from,
            "to": s.to,
            "action": s.action,
            "done": s.done,
        })).collect::<Vec<_>>(),
        "version_after": version_after(r),
    })
}

fn print_report(r: &MigrateReport) {
    let found = match &r.found {
        Some(v) => format!("key schema version {v}"),
        None => "no key schema stamp (layout version 1)".to_owned(),
    };
    out!(
        "prefix {}: {found}; this release speaks version {}",
        r.prefix,
        r.speaks
    );
    if r.steps.is_empty() {
        out!("nothing to do");
        return;
    }
    for (i, s) in r.steps.iter().enumerate() {
        let state = match (r.applied, s.done) {
            (false, _) => "would run",
            (true, true) => "done",
            (true, false) => "not run",
        };
        out!(
            "step {}: {} -> {}: {} [{state}]",
            i + 1,
            s.from,
            s.to,
            s.action
        );
    }
    if !r.applied {
        out!("dry run: nothing written; run with --apply to migrate");
    }
}

//! `sfu-redis migrate --dry-run | --apply`: move a prefix's keys to the key schema version
//! this release speaks (`sfu_redis::ops::schema::migrate`, whose module documentation lists the
//! steps). The step from version 1 to 2 needs every node of the prefix stopped.
//!
//! Exit codes (operators' scripts depend on them): 0 the prefix is at this release's version
//! (already, after `--apply`, or a `--dry-run` listed the steps it would take); 1 refused:
//! the prefix is stamped with a version this release does not know (newer, or not a number;
//! nothing written), or a step needs the fleet stopped (1 -> 2, or folding version 1 peer
//! indexes left over at version 2) and instances are live (their
//! heartbeat keys hold a boot token: the message names them; `--dry-run` refuses alike, as
//! `--apply` would); 2 bad flags, no Redis URL, Redis unreachable or failing (a run again
//! finishes what an interrupted `--apply` started).
//!
//! `--json` prints one object: {"prefix", "found", "version", "speaks", "dry_run", "steps":
//! [{"from", "to", "action", "done", "folds", "delete"}], "version_after"}:
//! - `found`: what the stamp held, null when there is none;
//! - `version`: the version the prefix was in: the stamp's, 1 for a prefix without a stamp
//!   but with a dataset token (written before stamps), null for a new prefix;
//! - a step's `from` is 0 for a new prefix, and 2 (`to` 2) for version 1 peer indexes left
//!   over under a version 2 stamp; `done` says it ran to its end;
//! - `folds` (steps 1 -> 2 and 2 -> 2; empty otherwise): one object per version 1 peer index, {"instance",
//!   "from_key", "into_key", "members", "rooms", "new_rooms", "new_room_ids", "skipped",
//!   "skipped_members", "not_a_set"}: the index read, the room index its rooms go into, the
//!   members read, the distinct rooms they name, how many of those the room index lacked
//!   (added, or to add with `--dry-run`) with the first 20 by id, the members skipped (not
//!   `<room>/<peer>` in wire form) with the first 20, and the key's type when it was no set
//!   (null otherwise; such a key is deleted with nothing folded);
//! - `delete`: the keys the step deletes (deleted with `--apply`): the peer indexes;
//! - `version_after`: the version the prefix is in when the command ends (null: a new prefix
//!   still unstamped).
//!
//! Ids and keys appear in wire form. A refusal (1) or an error (2) prints no JSON: the message
//! goes to stderr.

use clap::Args;
use serde_json::json;
use sfu_redis::ops::schema::{migrate, Fold, MigrateReport};
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
    /// Run those steps. The step from version 1 needs every node of the prefix stopped; it is
    /// refused while one runs (docs/src/ops/schema.md "Key schema versions").
    #[arg(long)]
    apply: bool,
    /// Print one JSON object: {"prefix", "found", "version", "speaks", "dry_run", "steps",
    /// "version_after"}; each step {"from", "to", "action", "done", "folds", "delete"}.
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
    if let Some(refusal) = report.refusal() {
        return Err(Failure::runtime(refusal));
    }
    if args.json {
        out!("{}", to_json(&report));
    } else {
        print_report(&report);
    }
    Ok(())
}

/// The version the prefix is in once the command ends, `None` while a new prefix is unstamped.
fn version_after(r: &MigrateReport) -> Option<u32> {
    match r.steps.last() {
        Some(last) if r.applied && r.steps.iter().all(|s| s.done) => Some(last.to),
        _ => r.version,
    }
}

fn fold_json(f: &Fold) -> serde_json::Value {
    json!({
        "instance": f.instance,
        "from_key": f.from_key,
        "into_key": f.into_key,
        "members": f.members,
        "rooms": f.rooms,
        "new_rooms": f.new_rooms,
        "new_room_ids": f.new_room_ids,
        "skipped": f.skipped,
        "skipped_members": f.skipped_members,
        "not_a_set": f.not_a_set,
    })
}

fn to_json(r: &MigrateReport) -> serde_json::Value {
    json!({
        "prefix": r.prefix,
        "found": r.found,
        "version": r.version,
        "speaks": r.speaks,
        "dry_run": !r.applied,
        "steps": r.steps.iter().map(|s| json!({
            "from": s.from,
            "to": s.to,
            "action": s.action,
            "done": s.done,
            "folds": s.folds.iter().map(fold_json).collect::<Vec<_>>(),
            "delete": s.deletes(),
        })).collect::<Vec<_>>(),
        "version_after": version_after(r),
    })
}

/// `a, b, c` and `(+N more)` when `shown` lists only the first of `total`.
fn listed(shown: &[String], total: u64) -> String {
    let mut s = shown.join(", ");
    let more = total.saturating_sub(shown.len() as u64);
    if more > 0 {
        s.push_str(&format!(" (+{more} more)"));
    }
    s
}

fn print_fold(f: &Fold, applied: bool) {
    if let Some(kind) = &f.not_a_set {
        out!(
            "  {}: {} holds a {kind}, not a set: nothing to fold; {}",
            f.instance,
            f.from_key,
            if applied { "deleted" } else { "to delete" }
        );
        return;
    }
    let verb = if applied { "added" } else { "to add" };
    let mut line = format!(
        "  {}: {} ({} members, {} rooms) -> {}: {} new rooms {verb}",
        f.instance, f.from_key, f.members, f.rooms, f.into_key, f.new_rooms
    );
    if f.new_rooms > 0 {
        line.push_str(&format!(": {}", listed(&f.new_room_ids, f.new_rooms)));
    }
    out!("{line}");
    if f.skipped > 0 {
        let shown: Vec<String> = f.skipped_members.iter().map(|m| format!("{m:?}")).collect();
        out!(
            "    skipped {} members that are not <room>/<peer> in wire form: {}",
            f.skipped,
            listed(&shown, f.skipped)
        );
    }
}

fn print_report(r: &MigrateReport) {
    let found = match (&r.found, r.version) {
        (Some(v), _) => format!("key schema version {v}"),
        (None, Some(v)) => format!(
            "no key schema stamp but a dataset token (written before stamps): layout version {v}"
        ),
        (None, None) => "a new prefix (no key schema stamp, no dataset token)".to_owned(),
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
        if s.to == 2 && s.from >= 1 && s.folds.is_empty() {
            out!("  no version 1 peer index left: only the stamp");
        }
        for f in &s.folds {
            print_fold(f, r.applied);
        }
        let deletes = s.deletes();
        if !deletes.is_empty() {
            out!(
                "  {} {} keys: {}",
                if r.applied { "deleted" } else { "to delete" },
                deletes.len(),
                deletes.join(", ")
            );
        }
    }
    if !r.applied {
        out!("dry run: nothing written; run with --apply to migrate");
    }
}

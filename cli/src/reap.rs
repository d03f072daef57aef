//! `sfu-redis reap --instance ID`: an operator reaps one dead instance now, without the stale
//! wait, the two-phase delay or a lease, with the leader's owner-CAS scripts
//! (`sfu_redis::ops::reap`).
//!
//! Exit codes (operators' scripts depend on them): 0 reaped (or, with --dry-run, would be
//! reaped); 1 refused (alive, stopped or fresh without --force, a live boot token even with
//! it, registered again during the reap, or not registered but with leftovers: use `fsck
//! --repair`; `--json` `refused`: `live`, `released`, `fresh`, `registered_again`,
//! `not_registered`); 2 bad input or cannot check (a malformed or unknown id, bad flags,
//! memory-only mode, Redis unreachable or failing; an unknown id, nothing of it under the
//! prefix, is `refused: unknown_instance` in `--json`, the others print no JSON).
//!
//! The reap publishes `instance_reaped` on the prefix's events channel with `instance` set to
//! this command's own id, [`reaper_id`] (`sfu-redis-reap@<host>:<pid>`), and `forced` true
//! when `--force` was given.

use std::cell::RefCell;

use clap::Args;
use serde_json::json;
use sfu_redis::ops::reap::{reap_instance, ReapOptions, ReapProgress, ReapReport, Refusal};
use sfu_redis::ErrorKind;

use crate::progress::Progress;
use crate::{with_place, Failure, RedisArgs};

#[derive(Debug, Args)]
pub(crate) struct ReapArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The instance to reap (as `status` lists it).
    #[arg(long, value_name = "ID")]
    instance: String,
    /// Check and list what would go (counts, and up to 20 room and peer ids); write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Also reap an instance that stopped cleanly (its heartbeat key holds `released`) or whose
    /// last heartbeat is within its stale threshold. Never reaps an instance whose heartbeat
    /// key holds a live boot token.
    #[arg(long)]
    force: bool,
    /// Print one JSON object: {"instance", "dry_run", "reaped", "refused", "rooms", "peers",
    /// "skipped_rooms", "failed", "kept", "rooms_listed", "peers_listed", "room_ids",
    /// "peer_ids", "stale_threshold_ms", "stale_threshold_from", "last_heartbeat_ms"};
    /// "refused" is null, live, released, fresh, not_registered (leftovers of it remain),
    /// unknown_instance (nothing of it under the prefix) or registered_again.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: ReapArgs) -> Result<(), Failure> {
    let config = args
        .redis
        .builder()
        .instance_id(&reaper_id())
        .build()
        .map_err(|e| Failure::config(&e))?;
    let Some(url) = config.redis_url() else {
        return Err(Failure::usage(
            "reap removes an instance from Redis: pass --redis-url or set REDIS_URL (memory-only mode has nothing to reap)",
        ));
    };
    let shown: RefCell<Option<Progress>> = RefCell::new(None);
    let progress = |p: &ReapProgress| {
        let mut shown = shown.borrow_mut();
        let bar = shown
            .get_or_insert_with(|| Progress::new("reap", Some(p.rooms_listed + p.peers_listed)));
        let c = &p.counts;
        bar.update(
            Some(c.rooms + c.skipped_rooms + c.peers),
            &format!(
                "{} of {} rooms, {} of {} peers",
                c.rooms + c.skipped_rooms,
                p.rooms_listed,
                c.peers,
                p.peers_listed
            ),
        );
    };
    let options = ReapOptions {
        force: args.force,
        dry_run: args.dry_run,
        progress: Some(&progress),
    };
    let report = reap_instance(&config, &args.instance, &options);
    if let Some(bar) = shown.borrow().as_ref() {
        bar.finish();
    }
    let report = report.map_err(|e| match e.kind() {
        ErrorKind::InvalidId => Failure::usage(format!("--instance {:?}: {e}", args.instance)),
        _ => Failure::usage(with_place("cannot reap", Some(url), &e)),
    })?;
    if args.json {
        out!("{}", to_json(&report));
    } else {
        print_report(&report);
    }
    verdict(&report, args.force, config.keys().prefix())
}

/// This command's own id, the `instance` of the `instance_reaped` event it publishes:
/// `sfu-redis-reap@<host>:<pid>` (the host name as an instance record gives it). Not an
/// instance id of the fleet (`SFU_INSTANCE_ID` is a node's, and is not read): subscribers
/// and the fleet page tell an operator's reap from a leader's by it.
pub(crate) fn reaper_id() -> String {
    // An id takes no control character and at most 256 bytes: a host name that breaks
    // either is cut down rather than failing the reap.
    let host: String = sfu_redis::ops::info::host_name()
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    format!("sfu-redis-reap@{host}:{}", std::process::id())
}

/// The report as the one JSON object of `--json`. In a dry run `rooms` and `peers` are what
/// would go (the index sizes); otherwise what this call deleted.
fn to_json(r: &ReapReport) -> serde_json::Value {
    let (rooms, peers) = if r.dry_run {
        (r.rooms_listed, r.peers_listed)
    } else {
        (r.counts.rooms, r.counts.peers)
    };
    json!({
        "instance": r.instance,
        "dry_run": r.dry_run,
        "reaped": r.reaped,
        "refused": r.refused.as_ref().map(Refusal::as_str),
        "rooms": rooms,
        "peers": peers,
        "skipped_rooms": r.counts.skipped_rooms,
        "failed": r.counts.failed,
        "kept": r.counts.kept,
        "rooms_listed": r.rooms_listed,
        "peers_listed": r.peers_listed,
        "room_ids": r.room_ids,
        "peer_ids": r.peer_ids,
        "stale_threshold_ms": r.stale_threshold_ms,
        "stale_threshold_from": r.stale_threshold_from,
        "last_heartbeat_ms": r.last_heartbeat_ms,
    })
}

/// The human report on stdout (refusals are said on stderr by [`verdict`]).
fn print_report(r: &ReapReport) {
    if r.refused.is_some() && r.counts == Default::default() {
        return;
    }
    if r.dry_run {
        out!(
            "dry run: {} would be reaped: {} rooms, {} peers (nothing written)",
            r.instance,
            r.rooms_listed,
            r.peers_listed
        );
        list("rooms", &r.room_ids, r.rooms_listed);
        list("peers", &r.peer_ids, r.peers_listed);
        return;
    }
    let c = &r.counts;
    out!(
        "{} {}: {} rooms, {} peers deleted, {} rooms skipped (taken over), {} members kept (a new life's), {} failed (bad data, see fsck)",
        if r.reaped { "reaped" } else { "partly reaped" },
        r.instance,
        c.rooms,
        c.peers,
        c.skipped_rooms,
        c.kept,
        c.failed
    );
}

/// `rooms    a, b, c (and 12 more)`.
fn list(what: &str, ids: &[String], total: u64) {
    if ids.is_empty() {
        return;
    }
    let more = total.saturating_sub(ids.len() as u64);
    let tail = if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    out!("{what:8} {}{tail}", ids.join(", "));
}

/// The exit status of a report: `Ok` when reaped (or a dry run would reap), else the refusal
/// with its code (module docs).
fn verdict(r: &ReapReport, forced: bool, prefix: &str) -> Result<(), Failure> {
    let id = &r.instance;
    let refuse = |m: String| Err(Failure::runtime(m));
    match &r.refused {
        None if r.reaped || r.dry_run => Ok(()),
        None if r.counts.kept > 0 => refuse(format!(
            "{id}: {} members written after the reap began were kept (a new life of the same id that has not registered yet); a leader's next round finishes the reap",
            r.counts.kept
        )),
        None => refuse(format!(
            "{id}: not finished: another reap of it (the leader's) is under way, or something was indexed under it after this reap began; a leader's next round finishes the reap"
        )),
        Some(Refusal::Live) => refuse(format!(
            "{id} is alive: its heartbeat key holds a process's boot token (a live process, or one that died less than its heartbeat TTL ago: the key expires by itself, retry then); refused, and --force {}",
            if forced { "never reaps such an instance" } else { "does not override this" }
        )),
        Some(Refusal::Released) => refuse(format!(
            "{id} stopped cleanly but its heartbeat key has not expired yet; refused (pass --force to reap it now)"
        )),
        Some(Refusal::Fresh { age_ms }) => refuse(format!(
            "{id} heartbeated {age_ms} ms ago, within its stale threshold of {} ms ({}); refused (pass --force to reap it now)",
            r.stale_threshold_ms,
            if r.stale_threshold_from == "record" { "its record's" } else { "the default: it has no record" }
        )),
        Some(Refusal::NotRegistered { leftovers: true }) => refuse(format!(
            "{id} is not registered (no heartbeat sorted-set entry) but keys of it remain; refused (run `sfu-redis fsck --repair`: it hands such an instance to the reaper)"
        )),
        Some(Refusal::NotRegistered { leftovers: false }) => Err(Failure::usage(format!(
            "no instance {id:?} under {prefix}: nothing of it is left, whether it never existed or a leader already reaped it (check the id with `sfu-redis status`, and --namespace / --stage / --branch)"
        ))),
        Some(Refusal::RegisteredAgain) => refuse(format!(
            "{id} registered again while it was being reaped; stopped (its new life's rooms and peers are kept)"
        )),
        Some(_) => refuse(format!("{id}: refused")),
    }
}

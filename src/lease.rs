//! The reaper lease: acquire (`SET NX PX` + epoch `INCR`), refresh (owner CAS `PEXPIRE`),
//! release (owner CAS `DEL`), and the local deadline that ends a term.
//!
//! Invariant 3: leadership ends on a local deadline started *before* the acquire/refresh was
//! sent (`sent + lease_ttl - lease_ttl/10`; the tenth absorbs clock-rate differences), not on
//! the next error. The server's TTL starts when the command arrives, after `sent`, so this node
//! stops acting before any other node can acquire. `LeaderState::current` reads the clock,
//! so a term ends on time even while the lease thread is blocked. The lease thread is a small
//! state machine ([`LeaseState`]); the reasoning above is spelled out where it sends
//! (`Lease::step`).
//!
//! Across a failover (docs/src/deploy/failover.md "Failover: what is guaranteed"): every lease write on a master
//! with replicas waits for one replica (`replicated`), and a term confirmed over a connection
//! to the old master does not let the node act once any connection has found a new one
//! (`Shared::is_leader` compares `Term::switches`): the lease thread refreshes at once, and
//! the node acts again only if the lease is there on the new master, or demotes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use redis::Value;

use crate::conn::{self, jitter, Backoff, Conn, Link, Redis};
use crate::error::{Error, Result};
use crate::event::{Event, LeaderLostReason};
use crate::keys::decode_id;
use crate::leader::{deadline, Term};
use crate::scripts::SCRIPTS;
use crate::state::{Ctx, Shared};
use crate::worker::{Periodic, Run};

/// What an acquire attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// We hold the lease; a new term with this epoch. `repaired` names a foreign value that
    /// was replaced (a lease key without TTL).
    Won {
        epoch: u64,
        repaired: Option<String>,
    },
    /// Another holder (its id, or `<type>` for a wrong-typed key).
    Held(String),
}

/// Tries to take the lease (`SET NX PX` + epoch `INCR`, `lease_acquire.lua`); epochs start
/// above `max_epoch`, the highest this node has seen.
pub(crate) fn acquire(ctx: &Ctx, con: &mut Conn, max_epoch: u64) -> Result<Acquire> {
    let op = "acquire lease";
    let mut inv = SCRIPTS.lease_acquire.prepare_invoke();
    inv.key(ctx.keys.leader())
        .key(ctx.keys.epoch())
        .key(ctx.keys.dataset())
        .arg(&ctx.me)
        .arg(ctx.timings.lease_ttl.as_millis() as u64)
        .arg(max_epoch);
    let (won, v, repaired): (i64, Value, String) = conn::call(con, op, &inv)?;
    let text: String = redis::from_redis_value(v)
        .map_err(|e| Error::bad_data(op, format!("unexpected reply: {e}")))?;
    if won == 1 {
        let epoch = text
            .parse()
            .map_err(|_| Error::bad_data(op, format!("epoch {text:?} is not a number")))?;
        Ok(Acquire::Won {
            epoch,
            repaired: Some(repaired).filter(|r| !r.is_empty()),
        })
    } else {
        Ok(Acquire::Held(text))
    }
}

/// Extends the lease if it still holds our id. `Ok(false)`: it does not.
pub(crate) fn refresh(ctx: &Ctx, con: &mut Conn) -> Result<bool> {
    let mut inv = SCRIPTS.lease_refresh.prepare_invoke();
    inv.key(ctx.keys.leader())
        .arg(&ctx.me)
        .arg(ctx.timings.lease_ttl.as_millis() as u64);
    Ok(conn::call::<i64>(con, "refresh lease", &inv)? == 1)
}

/// After a write of the lease (acquire or refresh) on a master with replicas: waits until one
/// replica acknowledged it (`WAIT 1 <command_timeout / 2>`). `Ok(true)` when it did or when the
/// master has no replica connected (`ROLE`: nothing to wait for), `Ok(false)` when none
/// acknowledged in time. Replication is asynchronous: without this a failover right after the
/// write could promote a replica that never saw it, and another node acquire a second lease
/// (and the same epoch) while this one leads. A replica the master dropped (its link down
/// longer than `repl-timeout`) that the sentinels promote later lacks the writes made
/// meanwhile: the switch fence covers that (the term does not act on the new master until a
/// refresh there confirms it). Through sentinels, a write to a master any of them no longer
/// names is unconfirmed too (a deposed master takes writes until it is demoted, and then
/// undoes them).
/// Measured cost and the decision: docs/src/deploy/failover.md "What the rules cost".
pub(crate) fn replicated(ctx: &Ctx, redis: &Redis, con: &mut Conn) -> Result<bool> {
    // Through sentinels: a master they no longer name (a failover in progress, this node's
    // connection not moved yet) may still take writes, all of which its demotion will undo.
    if redis.sentinels_disagree() {
        return Ok(false);
    }
    let replicas = match crate::sentinel::role(con) {
        Ok(crate::sentinel::Role::Master { replicas }) => replicas,
        // Not a master any more: the write itself was refused or will be lost; the caller's
        // next request finds the new master.
        Ok(crate::sentinel::Role::Other(r)) => {
            return Err(Error::redis(
                "confirm the lease write",
                redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the server is no longer a master",
                    format!("its ROLE is {r:?}"),
                )),
            ))
        }
        // ROLE refused (ACL): the replicas seen at connect.
        Err(_) => redis.route().replicas,
    };
    // On a cluster, the master of the control slot (where the lease and the registrations
    // live) is the one whose replicas count.
    let master = con.cluster_master_of(&ctx.keys.heartbeats());
    redis.note_replicas(replicas, master.clone());
    if replicas == 0 {
        // Through sentinels: a replica they could promote that the master does not list (it
        // is resyncing, or a failover under way detached it to promote it) would come up
        // without this write. Unconfirmed (chaos run, seed 14985523334794421937: a node that
        // had never seen a replica took epoch 10 on the old master during a SENTINEL
        // FAILOVER, and the new master handed out epoch 10 again).
        if redis.sentinel_promotable_replicas().is_some_and(|n| n > 0) {
            return Ok(false);
        }
        // A replica the master listed lately may have dropped off only for now (its link
        // timed out) and still be promoted by the sentinels (they promote a replica that has
        // been gone less than 10 x down-after-milliseconds): until that is long past, a lease
        // write without a replica confirms nothing. With no replica seen for 10 lease TTLs,
        // there is nothing a failover could promote.
        return Ok(!redis.replica_seen_within(
            ctx.timings.lease_ttl * REPLICA_GRACE_LEASES,
            master.as_deref(),
        ));
    }
    let wait_ms = (ctx.timings.command_timeout.as_millis() as u64 / 2).max(1);
    match redis::cmd("WAIT").arg(1).arg(wait_ms).query::<i64>(con) {
        Ok(acked) => Ok(acked >= 1),
        // Refused by the ACL or by a proxy that does not know WAIT: leading without the
        // confirmation beats never leading (no reaps at all); said at every lease write.
        Err(e) if e.code() == Some("NOPERM") || e.to_string().contains("unknown command") => {
            log::warn!(
                "WAIT is refused ({e}): lease writes are not confirmed by a replica, so a failover could grant a second lease; allow WAIT for this user"
            );
            Ok(true)
        }
        Err(e) => Err(Error::redis(
            "wait for a replica to acknowledge the lease",
            e,
        )),
    }
}

/// After the master last listed a replica, lease writes stay unconfirmed for this many lease
/// TTLs (15 minutes at the default 90 s): longer than Sentinel's window for promoting a replica
/// that dropped off (10 x `down-after-milliseconds`, 5 minutes at its default 30 s) as long as
/// `down-after-milliseconds` is below the lease TTL (docs/src/deploy/failover.md "Replicated lease writes").
pub(crate) const REPLICA_GRACE_LEASES: u32 = 10;

/// Deletes the lease if it still holds our id. `Ok(false)`: it did not.
pub(crate) fn release(ctx: &Ctx, con: &mut Conn) -> Result<bool> {
    let mut inv = SCRIPTS.lease_release.prepare_invoke();
    inv.key(ctx.keys.leader()).arg(&ctx.me);
    Ok(conn::call::<i64>(con, "release lease", &inv)? == 1)
}

/// Where the lease thread stands. The term itself lives in `LeaderState` (shared): the
/// heartbeat thread may end it (node reaped, data lost) between two steps, so every step reads
/// the state afresh ([`Lease::state`]) instead of keeping a copy that could disagree.
///
/// ```text
/// Follower --acquire won--> Leader(term)          (LeaderAcquired, under the term lock)
/// Leader   --refresh in time--> Leader(extended)
/// Leader   --refresh refused / failed / late, deadline passed--> Follower   (LeaderLost)
/// ```
#[derive(Debug, Clone, Copy)]
enum LeaseState {
    Follower,
    Leader(Term),
}

/// The lease thread's state between steps.
struct Lease<'a> {
    sh: &'a Shared,
    link: Link,
    /// Tells the reaper thread to abandon its round.
    demoted: &'a Sender<()>,
    /// When the next acquire or refresh is due.
    next: Instant,
}

impl Lease<'_> {
    fn state(&self) -> LeaseState {
        match self.sh.leader.raw() {
            Some(term) => LeaseState::Leader(term),
            None => LeaseState::Follower,
        }
    }

    /// Ends the term, if one runs, with `LeaderLost { reason }`, and tells the reaper.
    fn demote(&self, reason: LeaderLostReason) {
        // A term confirmed on a master before a failover stopped acting when the switch was
        // found (`Shared::is_leader`); its record ends there.
        let at = match self.state() {
            LeaseState::Leader(term) if term.switches != self.sh.redis.master_switches() => {
                self.sh.redis.switched_at().unwrap_or_else(Instant::now)
            }
            _ => Instant::now(),
        };
        if self.sh.leader.end_with_at(&self.sh.events, reason, at) {
            let _ = self.demoted.try_send(());
        }
    }

    /// One wake-up: the acquire or refresh if it is due, then the end of a term whose deadline
    /// passed; returns when to wake next (the next request, or the term's deadline if sooner,
    /// so a term ends on time even with no request due).
    fn step(&mut self, run: &mut Run<'_>) -> Instant {
        // A connection found another master (a failover) since the term was last confirmed:
        // the node does not act until a refresh confirms the lease there, so refresh now.
        let moved = matches!(self.state(), LeaseState::Leader(term)
            if term.switches != self.sh.redis.master_switches());
        if moved || Instant::now() >= self.next {
            // Invariant 3: `sent` is read BEFORE the request goes out, and the term the reply
            // starts or confirms ends at `deadline(sent, lease_ttl)`. The server starts the
            // lease's TTL when the request arrives, after `sent`, so this node's deadline (a
            // tenth of the TTL earlier still, for clock-rate differences) passes before the
            // lease can expire on the server and another node acquire it. A reply that comes
            // back after the current deadline confirms nothing (`refresh` demotes).
            let sent = Instant::now();
            self.next = match self.state() {
                LeaseState::Follower => self.acquire(sent, run),
                LeaseState::Leader(term) => self.refresh(term, sent, run),
            };
        }
        // A term whose deadline passed while we slept (or were paused) ends now.
        match self.state() {
            LeaseState::Leader(term) if Instant::now() >= term.deadline => {
                self.demote(LeaderLostReason::DeadlinePassed);
                self.next
            }
            // While leading, look for a master switch every heartbeat interval.
            LeaseState::Leader(term) => self
                .next
                .min(term.deadline)
                .min(Instant::now() + self.sh.ctx.timings.heartbeat_interval),
            LeaseState::Follower => self.next,
        }
    }

    /// Follower: tries to acquire; returns when to try again (or to refresh).
    fn acquire(&mut self, sent: Instant, run: &mut Run<'_>) -> Instant {
        let (sh, t) = (self.sh, self.sh.ctx.timings);
        if sh.schema_refused.lock().is_some() {
            // Parked by a foreign key schema stamp (heartbeat.rs): not registered, so it must
            // not lead either.
            return Instant::now() + t.lease_refresh;
        }
        let max_epoch = sh.max_epoch.load(Ordering::Relaxed);
        let mut switches = 0;
        let attempt = self.link.run_fenced(&sh.redis, |c, made| {
            switches = made;
            let won = acquire(&sh.ctx, c, max_epoch)?;
            if matches!(won, Acquire::Won { .. }) && Instant::now() >= deadline(sent, t.lease_ttl) {
                // The reply came back after the term it would start had already ended (this
                // process was paused between `sent` and the request): it confirms nothing.
                let _ = release(&sh.ctx, c);
                return Ok(Acquire::Held("<late>".into()));
            }
            if !matches!(won, Acquire::Won { .. }) || replicated(&sh.ctx, &sh.redis, c)? {
                return Ok(won);
            }
            // No replica saw the new lease: a failover now could grant a second one. Give
            // it back and try again later (safety before availability; a replica that is
            // gone stops counting once the master drops it).
            let _ = release(&sh.ctx, c);
            Ok(Acquire::Held("<not replicated>".into()))
        });
        match attempt {
            Ok(Acquire::Won { epoch, repaired }) => {
                sh.max_epoch.fetch_max(epoch, Ordering::Relaxed);
                if let Some(r) = repaired {
                    log::warn!("replaced a lease key of type {r} that had no TTL");
                }
                let term = Term {
                    epoch,
                    deadline: deadline(sent, t.lease_ttl),
                    switches,
                };
                sh.leader.begin(term, &sh.events);
                sh.publish(&mut self.link, &Event::LeaderAcquired { epoch });
                run.ok(sent + t.lease_refresh)
            }
            Ok(Acquire::Held(holder)) => {
                if holder == "<dataset new>" {
                    log::debug!("the dataset is younger than a lease TTL (fresh or after data loss); waiting to acquire");
                } else if holder == "<late>" {
                    log::warn!("won the lease only after the term's deadline (this process was paused?); released it");
                } else if holder == "<not replicated>" {
                    log::warn!("won the lease but no replica acknowledged it in time; released it, not leading (a failover could have granted a second lease)");
                } else if holder.starts_with('<') || decode_id(&holder).is_err() {
                    log::warn!("the lease key holds {holder:?}, not an instance id; waiting for it to expire");
                }
                run.ok(Instant::now() + jitter(t.lease_refresh))
            }
            Err(e) => {
                sh.note_error(&e);
                log::warn!("lease acquire failed: {e}");
                run.retry()
            }
        }
    }

    /// Leader: refreshes `term`; demotes at once on a refused, failed or late refresh. Returns
    /// when to refresh (or try to acquire) next.
    fn refresh(&mut self, term: Term, sent: Instant, run: &mut Run<'_>) -> Instant {
        let (sh, t) = (self.sh, self.sh.ctx.timings);
        let mut switches = term.switches;
        let attempt = self.link.run_fenced(&sh.redis, |c, made| {
            switches = made;
            // A refresh that has not come back by the term's deadline confirms nothing: wait
            // no longer than that for it, so the term ends (and `leader_lost` is said) on
            // time even when the master stalls.
            let left = term.deadline.saturating_duration_since(Instant::now());
            let bound = left.min(t.command_timeout).max(Duration::from_millis(1));
            let _ = c.set_read_timeout(Some(bound));
            let out = refresh(&sh.ctx, c).and_then(|held| {
                Ok(held && !replicated(&sh.ctx, &sh.redis, c)?).map(|unacked| (held, unacked))
            });
            let _ = c.set_read_timeout(Some(t.command_timeout));
            out
        });
        match attempt.map(|(held, unacked)| {
            if unacked {
                // The master extended the lease but no replica saw it: the term keeps its
                // deadline (a replica promoted now would expire the lease then).
                log::warn!("lease refreshed but no replica acknowledged it in time; the term keeps its current deadline");
                None
            } else {
                Some(held)
            }
        }) {
            Ok(None) => sent + t.lease_refresh,
            Ok(Some(true)) if Instant::now() < term.deadline => {
                let extended = sh.leader.extend(Term {
                    epoch: term.epoch,
                    deadline: deadline(sent, t.lease_ttl),
                    switches,
                });
                if extended {
                    sent + t.lease_refresh
                } else {
                    // Ended by the heartbeat meanwhile (reaped or data lost): stays ended.
                    Instant::now() + jitter(t.lease_refresh)
                }
            }
            Ok(Some(true)) => {
                self.demote(LeaderLostReason::DeadlinePassed);
                Instant::now()
            }
            Ok(Some(false)) => {
                log::warn!("lease no longer holds our id; demoting");
                self.demote(LeaderLostReason::LeaseTaken);
                Instant::now() + jitter(t.lease_refresh)
            }
            Err(e) => {
                sh.note_error(&e);
                log::warn!("lease refresh failed; demoting: {e}");
                self.demote(LeaderLostReason::RefreshFailed);
                run.retry()
            }
        }
    }

    /// After shutdown: ends the term (`LeaderLost { shutdown }`) and releases the lease.
    fn stop(mut self) {
        let sh = self.sh;
        let was_leader = sh.leader.end_with(&sh.events, LeaderLostReason::Shutdown);
        if was_leader {
            let _ = self.demoted.try_send(());
        }
        // Always try: a refresh that failed on our side may still have extended the lease.
        let released = self.link.run(&sh.redis, |c| release(&sh.ctx, c));
        if let Err(e) = &released {
            log::warn!("could not release the lease on shutdown (it will expire): {e}");
        }
        // A release that timed out: the publish would wait one more command timeout (or
        // more, opening a new connection) on a Redis that just did not answer, and delay the
        // stop. The local LeaderLost event is out already, and the other nodes see the lease
        // expire. A release that failed at once (a dropped connection) still publishes.
        if was_leader && !matches!(&released, Err(e) if e.is_timeout()) {
            sh.publish(
                &mut self.link,
                &Event::LeaderLost {
                    reason: LeaderLostReason::Shutdown,
                },
            );
        }
    }
}

/// The lease thread: non-leaders try to acquire every `lease_refresh` (jittered); the leader
/// refreshes every `lease_refresh` and demotes at once on a failed, refused or late refresh.
/// `demoted` tells the reaper thread to abandon its round. On shutdown the lease is released
/// (unless the node crashed: a simulated kill -9 leaves it to expire).
pub(crate) fn run(sh: &Shared, shutdown: &Receiver<()>, demoted: &Sender<()>) {
    let refresh_every = sh.ctx.timings.lease_refresh;
    let mut lease = Lease {
        sh,
        link: Link::new(),
        demoted,
        next: Instant::now(),
    };
    let crashed = || sh.is_crashed();
    let backoff = Backoff::new(refresh_every / 8, refresh_every);
    Periodic::new(shutdown, &crashed, backoff).run(Instant::now(), |run| lease.step(run));
    if !sh.is_crashed() {
        lease.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Timings};
    use sfu_redis_testkit::devserver::LocalRedis;

    fn epoch(ctx: &Ctx, con: &mut Conn) -> u64 {
        redis::cmd("GET").arg(ctx.keys.epoch()).query(con).unwrap()
    }

    // Protects lease_acquire.lua's two guards of invariant 3 directly: no lease on a dataset
    // newer than a lease TTL, and the fencing epoch's monotonicity: a lease
    // taken on a Redis whose epoch counter is behind what the acquiring node has seen (Redis
    // lost its data, or a promoted replica missed the last INCRs) starts above the highest
    // epoch seen, never at the store's lower count; a higher count in the store is kept. The
    // heartbeat raises the counter too (heartbeat.lua), so only a direct acquire shows this
    // guard on its own (issue 32's mutation check).
    #[test]
    fn an_acquire_waits_out_a_new_dataset_and_starts_above_the_highest_epoch_seen() {
        let server = LocalRedis::start().expect("start redis-server");
        let cfg = Config::builder()
            .redis_url(server.url())
            .stage("unit")
            .instance_id("a")
            .timings(Timings::fast())
            .build()
            .unwrap();
        let ctx = Ctx::from_config(&cfg).unwrap();
        let mut con = Redis::new(&server.url(), Duration::from_secs(5))
            .unwrap()
            .connect()
            .unwrap();
        // A dataset token written just now (Redis lost its data, or this is a new prefix): no
        // lease for a lease TTL, so a leader that still believes in its term on the lost data
        // cannot overlap with a new one (invariant 3; lease_acquire.lua).
        let now: String = {
            let (s, us): (String, String) = redis::cmd("TIME").query(&mut con).unwrap();
            format!(
                "{}",
                s.parse::<u64>().unwrap() * 1000 + us.parse::<u64>().unwrap() / 1000
            )
        };
        let _: () = redis::cmd("SET")
            .arg(ctx.keys.dataset())
            .arg(format!("unit:{now}"))
            .query(&mut con)
            .unwrap();
        assert_eq!(
            acquire(&ctx, &mut con, 0).unwrap(),
            Acquire::Held("<dataset new>".into())
        );
        // A dataset token from long ago: the lease may be granted at once.
        let _: () = redis::pipe()
            .set(ctx.keys.dataset(), "unit:1")
            .ignore()
            .set(ctx.keys.epoch(), 3)
            .ignore()
            .query(&mut con)
            .unwrap();
        match acquire(&ctx, &mut con, 10).unwrap() {
            Acquire::Won { epoch: e, .. } => assert_eq!(e, 11, "above the 10 seen, not 3 + 1"),
            other => panic!("acquire gave {other:?}"),
        }
        assert_eq!(epoch(&ctx, &mut con), 11);
        assert!(matches!(
            acquire(&ctx, &mut con, 10).unwrap(),
            Acquire::Held(_)
        ));
        assert!(release(&ctx, &mut con).unwrap());
        // The store ahead of what this node saw: kept and raised.
        let _: () = redis::cmd("SET")
            .arg(ctx.keys.epoch())
            .arg(40)
            .query(&mut con)
            .unwrap();
        match acquire(&ctx, &mut con, 10).unwrap() {
            Acquire::Won { epoch: e, .. } => assert_eq!(e, 41),
            other => panic!("acquire gave {other:?}"),
        }
    }
}

//! The failover step (`--sentinel` with the demo's own group): `SENTINEL FAILOVER` while the
//! nodes run; nobody tells them, they find the new master through the sentinels. Measures
//! when each node's heartbeat lands on the new master, then checks the survivors' data there.

use std::collections::BTreeMap;
use std::thread::ScopedJoinHandle;

use sfu_redis::LeaderLostReason;

use super::*;

/// The new master, as the demo's own connection found it through the sentinels.
struct NewMaster {
    addr: String,
    via: Option<String>,
    /// Its clock (ms) when the demo first reached it as master: a heartbeat score above it
    /// was written on it (a replica takes no writes, and the old master's no longer reach it).
    since_ms: i64,
}

/// What the watch of a failover saw.
struct Followed {
    new: NewMaster,
    /// `(old, new)` master ports, from the test kit once the group settled.
    ports: (u16, u16),
}

/// `named by sentinel <addr>`, or what the library fell back to.
pub(super) fn named_by(via: Option<&str>) -> String {
    match via {
        Some(v) => format!("named by sentinel {v}"),
        None => "no sentinel answered: the last known master".into(),
    }
}

impl Demo {
    /// A line of the demo itself on the timeline.
    fn note(&mut self, who: &str, text: String) {
        self.pump();
        let at = self.elapsed();
        self.entries.push(Entry {
            at,
            instance: who.to_owned(),
            what: What::Note(text),
        });
    }

    /// Step c with a private group: fail its master over, watch every live node follow, then
    /// check the survivors' data on the new master (`dead`: the instance reaped so far).
    pub(super) fn step_failover(&mut self, group: &SentinelGroup, dead: &str) -> Result<(), Stop> {
        let letter = self.next_letter();
        let name = group.master_name().to_owned();
        out!(
            "\n[{letter}] fail the Redis master over (SENTINEL FAILOVER {name}); nobody tells the nodes: each new connection asks the sentinels"
        );
        self.reconnect()?;
        let before = self.redis.route();
        let old = before
            .master
            .clone()
            .ok_or("the demo's connection names no master: the URL is not a sentinel URL")?;
        // The test kit sends it to the first running sentinel.
        let to = group
            .sentinels()
            .iter()
            .find(|s| s.is_alive() && !s.is_stopped())
            .map_or_else(
                || "no running sentinel".to_owned(),
                |s| format!("sentinel 127.0.0.1:{}", s.port()),
            );
        self.say(&format!(
            "master {old} ({}, {} replica(s) connected); SENTINEL FAILOVER sent to {to}",
            named_by(before.via.as_deref()),
            before.replicas
        ));
        Self::explain("the sentinels promote the replica; the old master keeps taking writes until it is turned");
        Self::explain("into a replica (READONLY): a node's next connection asks the sentinels and finds the new one");
        self.pump();
        let mark = self.entries.len();
        let sent = self.elapsed();
        self.note(
            picture::REDIS_LANE,
            format!("** SENTINEL FAILOVER {name} (master {old}) **"),
        );
        let mut narrated = mark;
        let followed = std::thread::scope(|s| {
            let job = s.spawn(|| group.failover());
            self.follow_failover(&old, sent, job, &mut narrated)
        })?;
        let Followed { new, ports } = followed;
        let matches = |addr: &str, port: u16| addr.rsplit(':').next() == Some(&port.to_string());
        self.check(
            "the sentinels promoted the replica, and a new connection through them reaches it",
            matches(&old, ports.0) && matches(&new.addr, ports.1) && ports.0 != ports.1,
            format!(
                "master {old} -> {}, {}; the group reports {} -> {}",
                new.addr,
                named_by(new.via.as_deref()),
                ports.0,
                ports.1
            ),
        );
        Self::explain(
            "on a master switch each node writes back the pins, peers and index entries it holds",
        );
        Self::explain("(replication is asynchronous: the last writes before a failover may be missing on the new master)");
        self.wait_more_heartbeats(2)?;
        self.narrate_switch(narrated);
        let first = self.checks.len();
        let survivors: Vec<String> = self
            .members
            .iter()
            .filter(|m| !m.crashed)
            .map(|m| m.id.clone())
            .collect();
        let ctx = format!(" on the new master {}", new.addr);
        self.read_checks(&survivors, &[dead.to_owned()], &ctx);
        let route = self.redis.route();
        self.check(
            &format!("the demo's checks read the new master {}", new.addr),
            route.master.as_deref() == Some(new.addr.as_str()),
            format!(
                "its new connection went to {}, {}",
                route.master.as_deref().unwrap_or("no master"),
                named_by(route.via.as_deref())
            ),
        );
        let ran = &self.checks[first..];
        let failed = ran.iter().filter(|c| !c.ok).count();
        self.say(&format!(
            "checks on the new master (the rooms, peers and indexes of {}; nothing left of {dead}): {}",
            survivors.join(" and "),
            if failed == 0 {
                format!("all {} passed", ran.len())
            } else {
                format!("{failed} of {} FAILED (listed with the checks below)", ran.len())
            }
        ));
        Ok(())
    }

    /// Narrates what the switch did to the lease and the reaper, from timeline entry `from`
    /// on; returns where to go on next time. A refresh that fails during the switch ends the
    /// term at once; a live node whose heartbeats paused on the new master may be listed as a
    /// candidate, and the two-phase re-check keeps it (the final checks fail if any live node
    /// lost a room).
    fn narrate_switch(&mut self, from: usize) -> usize {
        self.pump();
        let live: Vec<String> = self
            .members
            .iter()
            .filter(|m| !m.crashed)
            .map(|m| m.id.clone())
            .collect();
        let mut lines = Vec::new();
        for e in &self.entries[from..] {
            match e.event() {
                Some(Event::Candidates { instances, .. }) => {
                    let alive: Vec<&str> = instances
                        .iter()
                        .filter(|i| live.contains(i))
                        .map(String::as_str)
                        .collect();
                    if !alive.is_empty() {
                        lines.push((
                            format!(
                                "{}: candidates [{}] -- heartbeats paused on the new master during the switch;",
                                e.instance,
                                alive.join(", ")
                            ),
                            "the two-phase re-check reaps only an instance still dead by then (final check: no live node lost a room)".to_owned(),
                        ));
                    }
                }
                Some(ev @ Event::LeaderLost { reason }) => {
                    let why = match reason {
                        LeaderLostReason::RefreshFailed => {
                            "its lease refresh failed during the switch"
                        }
                        LeaderLostReason::LeaseTaken => {
                            "the lease key on the new master no longer names it"
                        }
                        LeaderLostReason::DeadlinePassed => {
                            "no refresh a replica acknowledged came back before its term's deadline"
                        }
                        LeaderLostReason::Shutdown => "it shut down",
                    };
                    lines.push((
                        format!(
                            "{}: leader_lost {} -- {why}; the term ends at once",
                            e.instance,
                            event_fields(ev)
                        ),
                        if *reason == LeaderLostReason::LeaseTaken {
                            String::new()
                        } else {
                            format!(
                                "nobody leads until its lease key on the new master expires (within {} ms)",
                                self.timings.lease_ttl.as_millis()
                            )
                        },
                    ))
                }
                Some(ev @ Event::LeaderAcquired { .. }) => lines.push((
                    format!(
                        "{}: leader_acquired {} -- the old lease key expired on the new master",
                        e.instance,
                        event_fields(ev)
                    ),
                    String::new(),
                )),
                _ => {}
            }
        }
        for (line, more) in lines {
            self.say(&line);
            if !more.is_empty() {
                Self::explain(&more);
            }
        }
        self.entries.len()
    }

    /// Watches the failover `job` (the test kit's `SentinelGroup::failover`, which returns once
    /// the group settled) until it is done and every live node heartbeated on the new master.
    fn follow_failover(
        &mut self,
        old: &str,
        sent: Duration,
        job: ScopedJoinHandle<'_, sfu_redis::Result<(u16, u16)>>,
        narrated: &mut usize,
    ) -> Result<Followed, Stop> {
        let deadline = Instant::now() + STEP_DEADLINE;
        let mut job = Some(job);
        let mut ports = None;
        let mut new: Option<NewMaster> = None;
        let mut seen: BTreeMap<String, Duration> = BTreeMap::new();
        let mut last_problem = String::from("none");
        let mut announced = false;
        loop {
            *narrated = self.narrate_switch(*narrated);
            self.live_leaders();
            if job.as_ref().is_some_and(|j| j.is_finished()) {
                match job.take().map(ScopedJoinHandle::join) {
                    Some(Ok(Ok((o, n)))) => {
                        ports = Some((o, n));
                        self.say(&format!(
                            "the group settled: every sentinel names 127.0.0.1:{n}; the old master 127.0.0.1:{o} replicates it, in sync"
                        ));
                    }
                    Some(Ok(Err(e))) => return Err(format!("the failover failed: {e}")),
                    Some(Err(_)) | None => return Err("the failover thread panicked".into()),
                }
            }
            if new.is_none() {
                match self.find_new_master(old) {
                    Ok(Some(found)) => {
                        let at = self.elapsed();
                        self.say(&format!(
                            "new master {} ({}): promoted, reached {} after the command",
                            found.addr,
                            named_by(found.via.as_deref()),
                            secs(at.saturating_sub(sent))
                        ));
                        self.note(
                            picture::REDIS_LANE,
                            format!(
                                "** new master {} ({}) **",
                                found.addr,
                                named_by(found.via.as_deref())
                            ),
                        );
                        new = Some(found);
                    }
                    Ok(None) => last_problem = format!("the sentinels still name {old}"),
                    Err(e) => last_problem = e,
                }
            }
            if let Some(nm) = &new {
                let (since_ms, addr) = (nm.since_ms, nm.addr.clone());
                let waiting: Vec<String> = self
                    .members
                    .iter()
                    .filter(|m| !m.crashed && !seen.contains_key(&m.id))
                    .map(|m| m.id.clone())
                    .collect();
                for id in waiting {
                    let score: Result<Option<f64>, String> = query(
                        &mut self.con,
                        redis::cmd("ZSCORE").arg(self.keys.heartbeats()).arg(&id),
                    );
                    match score {
                        Ok(Some(s)) if s > since_ms as f64 => {
                            let at = self.elapsed();
                            seen.insert(id.clone(), at);
                            self.say(&format!(
                                "{id}: first heartbeat on the new master, {} after the command",
                                secs(at.saturating_sub(sent))
                            ));
                            self.note(
                                &id,
                                format!("** first heartbeat on the new master {addr} **"),
                            );
                        }
                        Ok(_) => last_problem = format!("no heartbeat of {id} on {addr} yet"),
                        Err(e) => {
                            last_problem = format!("{addr}: {e}");
                            // Read the master the sentinels name now on the next poll.
                            if let Err(e) = self.reconnect() {
                                last_problem = e;
                            }
                            break;
                        }
                    }
                }
            }
            let all_seen = new.is_some()
                && self
                    .members
                    .iter()
                    .all(|m| m.crashed || seen.contains_key(&m.id));
            if all_seen && !announced {
                announced = true;
                let last = seen.values().max().copied().unwrap_or(sent);
                let addr = new.as_ref().map(|n| n.addr.as_str()).unwrap_or_default();
                self.say(&format!(
                    "every node heartbeats on the new master {addr}: {} after SENTINEL FAILOVER",
                    secs(last.saturating_sub(sent))
                ));
                Self::explain(&format!(
                    "(measured: each node's first heartbeat score above the new master's clock when the demo reached it, polled every {} ms)",
                    POLL.as_millis()
                ));
            }
            if let (true, None, Some(new), Some(ports)) = (all_seen, &job, &new, ports) {
                return Ok(Followed {
                    new: NewMaster {
                        addr: new.addr.clone(),
                        via: new.via.clone(),
                        since_ms: new.since_ms,
                    },
                    ports,
                });
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the failover did not complete within {} s (group settled: {}; last: {last_problem})",
                    STEP_DEADLINE.as_secs(),
                    job.is_none()
                ));
            }
            self.idle(POLL)?;
        }
    }

    /// A new connection through the sentinels; `Some` (and it becomes the demo's connection)
    /// once it reaches a master other than `old`, with that master's clock.
    fn find_new_master(&mut self, old: &str) -> Result<Option<NewMaster>, String> {
        let mut con = self.redis.connect().map_err(|e| e.to_string())?;
        let route = self.redis.route();
        let Some(addr) = route.master.filter(|m| m != old) else {
            return Ok(None);
        };
        let since_ms = server_time_ms(&mut con).map_err(|e| e.to_string())?;
        self.con = con;
        Ok(Some(NewMaster {
            addr,
            via: route.via,
            since_ms,
        }))
    }

    /// Waits until every live member has completed `more` heartbeat ticks after now.
    fn wait_more_heartbeats(&mut self, more: u64) -> Result<(), Stop> {
        let want: Vec<(usize, u64)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.crashed)
            .map(|(i, m)| (i, m.node.stats().heartbeats + more))
            .collect();
        let deadline = Instant::now() + STEP_DEADLINE;
        loop {
            self.pump();
            self.live_leaders();
            let behind = want
                .iter()
                .find(|(i, n)| self.members[*i].node.stats().heartbeats < *n);
            let Some((i, _)) = behind else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} completed no {more} heartbeats on the new master in {} s (last error: {})",
                    self.members[*i].id,
                    STEP_DEADLINE.as_secs(),
                    self.members[*i]
                        .node
                        .stats()
                        .last_error
                        .unwrap_or_else(|| "none".into())
                ));
            }
            self.idle(POLL)?;
        }
    }
}

//! The demo's checks read back from Redis: the survivor's rooms, peers and registration
//! intact, nothing of the dead left (through the audit's one consistency scan).

use super::*;

impl Demo {
    /// Step e (run while the survivor is alive): Redis holds the survivor's data and nothing of
    /// the dead. Returns the fleet status for the table.
    pub(super) fn data_checks(&mut self, base: &ConfigBuilder) -> Option<FleetStatus> {
        let (survivor, dead) = self.outcome.clone()?;
        self.read_checks(std::slice::from_ref(&survivor), &dead, "");

        let live_problems: Vec<String> = self
            .entries
            .iter()
            .filter(|e| {
                matches!(
                    e.event(),
                    Some(Event::RoomLost { .. } | Event::ReapedSelf { .. })
                )
            })
            .map(|e| {
                format!(
                    "{} {}",
                    e.instance,
                    e.event().map(Event::name).unwrap_or_default()
                )
            })
            .collect();
        self.check(
            "no live instance lost a room (no room_lost / reaped_self events)",
            live_problems.is_empty(),
            if live_problems.is_empty() {
                "none seen".into()
            } else {
                live_problems.join(", ")
            },
        );
        self.check(
            "never more than one live instance believed it led",
            self.most_leaders <= 1,
            format!(
                "at most {} at once over {} polls",
                self.most_leaders, self.leader_polls
            ),
        );
        let config = match base.clone().instance_id(&survivor).build() {
            Ok(c) => c,
            Err(e) => {
                self.check("fleet status", false, e.to_string());
                return None;
            }
        };
        match fleet_status(&config) {
            Ok(st) => {
                let ids: Vec<&str> = st.instances.iter().map(|i| i.id.as_str()).collect();
                let ok = ids == [survivor.as_str()]
                    && st.instances.iter().all(|i| i.alive)
                    && st.leader.as_deref() == Some(survivor.as_str())
                    && st.leader_alive
                    && st.is_clean();
                let mut problems: Vec<&str> = st.problems.iter().map(String::as_str).collect();
                for i in &st.instances {
                    problems.extend(i.problems.iter().map(String::as_str));
                }
                self.check(
                    "fleet status: only the survivor is registered, alive, and it leads; no problems",
                    ok,
                    format!(
                        "instances {ids:?}, leader {}, problems {problems:?}",
                        st.leader.as_deref().unwrap_or("none")
                    ),
                );
                Some(st)
            }
            Err(e) => {
                self.check("fleet status", false, e.to_string());
                None
            }
        }
    }

    /// On a new connection (the master the sentinels name now): every survivor's data is
    /// intact and nothing of the dead remains. `ctx` ends every check's name (`""`, or ` on
    /// the new master ...`).
    pub(super) fn read_checks(&mut self, survivors: &[String], dead: &[String], ctx: &str) {
        if let Err(e) = self.reconnect() {
            self.check(&format!("Redis reachable for the checks{ctx}"), false, e);
            return;
        }
        match self.survivor_checks(survivors, ctx) {
            Ok(()) => {}
            Err(e) => self.check(&format!("survivor's data readable{ctx}"), false, e),
        }
        match self.leftover_check(dead, ctx) {
            Ok(()) => {}
            Err(e) => self.check(&format!("scan for leftovers of the dead{ctx}"), false, e),
        }
    }

    /// Each survivor's pins, metadata, peer sets, guest maps, peer records, indexes and
    /// heartbeat are all still there. What it owns is read key by key; whether the indexes,
    /// guest maps and peer sets agree with the records (invariant 4) is the library's one
    /// consistency scan (`sfu_redis::ops::audit::scan`): a problem at one of a survivor's rooms
    /// fails its peers check, one at its indexes or heartbeat its indexes check; any other
    /// problem under the prefix fails the indexes check of a sole survivor, or a check of its
    /// own when there are several.
    pub(super) fn survivor_checks(
        &mut self,
        survivors: &[String],
        ctx: &str,
    ) -> Result<(), String> {
        let scan = audit::scan(&self.keys, &mut self.con).map_err(|e| e.to_string())?;
        let n = survivors.len();
        let (mut peers, mut index) = (vec![Vec::new(); n], vec![Vec::new(); n]);
        let mut other = Vec::new();
        for p in &scan {
            let line = format!("{} at {}: {}", p.kind, p.key, p.detail);
            let in_rooms_of = survivors
                .iter()
                .position(|s| in_rooms(&self.keys, p, &room_ids(letter_of(s))));
            let of_instance = self.keys.parse(&p.key).and_then(|k| {
                let i = k.instance()?;
                survivors.iter().position(|s| s == i)
            });
            match (in_rooms_of, of_instance) {
                (Some(i), _) => peers[i].push(line),
                (None, Some(i)) => index[i].push(line),
                (None, None) if n == 1 => index[0].push(line),
                (None, None) => other.push(line),
            }
        }
        let report = |problems: Vec<String>, ok: String| {
            if problems.is_empty() {
                (true, ok)
            } else {
                (false, problems.join("; "))
            }
        };
        for ((survivor, mut peers), mut index) in survivors.iter().zip(peers).zip(index) {
            let rooms = room_ids(letter_of(survivor));
            let pins = self.survivor_pins(survivor, &rooms)?;
            peers.extend(self.survivor_peers(survivor, &rooms)?);
            index.extend(self.survivor_registration(survivor)?);
            let r = rooms.len();
            let (ok, d) = report(
                pins,
                format!("{r} pins and {r} meta hashes name {survivor}"),
            );
            self.check(
                &format!("{survivor}'s room pins and metadata intact{ctx}"),
                ok,
                d,
            );
            let (ok, d) = report(
                peers,
                format!(
                    "{} peers with records and guest mappings",
                    r * PEERS_PER_ROOM
                ),
            );
            self.check(
                &format!("{survivor}'s peers, guest maps and peer records intact{ctx}"),
                ok,
                d,
            );
            let (ok, d) = report(index, "room index, heartbeat key and score".into());
            self.check(
                &format!("{survivor}'s indexes and heartbeat intact{ctx}"),
                ok,
                d,
            );
        }
        if n > 1 {
            let (ok, d) = report(
                other,
                "the consistency scan found none outside the survivors' rooms and indexes".into(),
            );
            self.check(
                &format!("no other inconsistency under the prefix{ctx}"),
                ok,
                d,
            );
        }
        Ok(())
    }

    /// Each room's pin and metadata name the survivor.
    pub(super) fn survivor_pins(
        &mut self,
        survivor: &str,
        rooms: &[String],
    ) -> Result<Vec<String>, String> {
        let con = &mut self.con;
        let mut pins = Vec::new();
        for room in rooms {
            let rk = self.keys.room(room);
            let owner: Option<String> = query(con, redis::cmd("GET").arg(&rk.owner))?;
            if owner.as_deref() != Some(survivor) {
                pins.push(format!("{} is {owner:?}", rk.owner));
            }
            let meta: Option<String> = query(con, redis::cmd("HGET").arg(&rk.meta).arg("owner"))?;
            if meta.as_deref() != Some(survivor) {
                pins.push(format!("{} owner is {meta:?}", rk.meta));
            }
        }
        Ok(pins)
    }

    /// Each room holds exactly its peers, each with its record (the survivor, its guest, its
    /// host field) and its guest pointing at it.
    pub(super) fn survivor_peers(
        &mut self,
        survivor: &str,
        rooms: &[String],
    ) -> Result<Vec<String>, String> {
        let con = &mut self.con;
        let mut peers = Vec::new();
        for room in rooms {
            let rk = self.keys.room(room);
            let set: BTreeSet<String> = scan::collect(con, Scan::set(&rk.peers))
                .map_err(redis_failed)?
                .into_iter()
                .map(|m| String::from_utf8_lossy(&m).into_owned())
                .collect();
            let want: BTreeSet<String> = (1..=PEERS_PER_ROOM).map(|k| peer_id(room, k)).collect();
            if set != want {
                peers.push(format!("{} holds {set:?}", rk.peers));
            }
            for k in 1..=PEERS_PER_ROOM {
                let (peer, guest) = (peer_id(room, k), guest_id(room, k));
                let mapped: Option<String> =
                    query(con, redis::cmd("HGET").arg(&rk.guests).arg(&guest))?;
                if mapped.as_deref() != Some(peer.as_str()) {
                    peers.push(format!("{} {guest} -> {mapped:?}", rk.guests));
                }
                let key = self.keys.peer(room, &peer);
                let (inst, g, name): (Option<String>, Option<String>, Option<String>) = query(
                    con,
                    redis::cmd("HMGET")
                        .arg(&key)
                        .arg("instance")
                        .arg("guest")
                        .arg("display_name"),
                )?;
                let want_name = format!("Guest {k}");
                if inst.as_deref() != Some(survivor)
                    || g.as_deref() != Some(guest.as_str())
                    || name.as_deref() != Some(want_name.as_str())
                {
                    peers.push(format!(
                        "{key} is instance={inst:?} guest={g:?} display_name={name:?}"
                    ));
                }
            }
        }
        Ok(peers)
    }

    /// The survivor's heartbeat key and sorted-set score exist.
    pub(super) fn survivor_registration(&mut self, survivor: &str) -> Result<Vec<String>, String> {
        let con = &mut self.con;
        let hb: bool = query(con, redis::cmd("EXISTS").arg(self.keys.heartbeat(survivor)))?;
        let score: Option<i64> = query(
            con,
            redis::cmd("ZSCORE")
                .arg(self.keys.heartbeats())
                .arg(survivor),
        )?;
        if !hb || score.is_none() {
            return Ok(vec![format!(
                "heartbeat key present: {hb}, sorted-set score: {score:?}"
            )]);
        }
        Ok(Vec::new())
    }

    /// Scans every key under the prefix: no key name, string value, hash field or value, set
    /// member or sorted-set member may contain a dead instance's id or one of its room ids
    /// (peer and guest ids are built from the room ids, so they are covered too).
    pub(super) fn leftover_check(&mut self, dead: &[String], ctx: &str) -> Result<(), String> {
        let mut needles: Vec<String> = dead.to_vec();
        for d in dead {
            needles.extend(room_ids(letter_of(d)));
        }
        let all = scan_keys(&mut self.con, &self.keys)?;
        let mut values = 0usize;
        let mut tombstones = 0usize;
        let mut problems = Vec::new();
        let hit = |s: &str| needles.iter().find(|n| s.contains(n.as_str())).cloned();
        for key in &all {
            // A reap tombstone names the life a reap took, kept a day by design (a zombie is
            // told on any master it resumes on): not a leftover.
            if matches!(
                self.keys.parse(key),
                Some(sfu_redis::keys::ParsedKey::InstanceReaped(_))
            ) {
                tombstones += 1;
                continue;
            }
            if let Some(n) = hit(key) {
                problems.push(format!("key {key} (refers to {n})"));
            }
            let ty: String = query(&mut self.con, redis::cmd("TYPE").arg(key))?;
            let items: Vec<Vec<u8>> = match ty.as_str() {
                "string" => query::<Option<Vec<u8>>>(&mut self.con, redis::cmd("GET").arg(key))?
                    .into_iter()
                    .collect(),
                "hash" => scan::collect(&mut self.con, Scan::hash(key)).map_err(redis_failed)?,
                "set" => scan::collect(&mut self.con, Scan::set(key)).map_err(redis_failed)?,
                "zset" => {
                    scan::collect(&mut self.con, Scan::sorted_set(key)).map_err(redis_failed)?
                }
                "list" => query(&mut self.con, redis::cmd("LRANGE").arg(key).arg(0).arg(-1))?,
                "none" => Vec::new(), // expired between SCAN and TYPE
                other => {
                    problems.push(format!("key {key} has unexpected type {other}"));
                    Vec::new()
                }
            };
            for item in items {
                values += 1;
                let s = String::from_utf8_lossy(&item);
                if let Some(n) = hit(&s) {
                    problems.push(format!("{key} holds {s:?} (refers to {n})"));
                }
            }
        }
        let ok = problems.is_empty() && !all.is_empty();
        let detail = if problems.is_empty() {
            format!(
                "scanned {} keys and {values} members/fields/values under {}:*; none mention {}{}",
                all.len() - tombstones,
                self.keys.prefix(),
                needles.join(", "),
                if tombstones > 0 {
                    format!(" ({tombstones} reap tombstones, kept a day by design, not scanned)")
                } else {
                    String::new()
                }
            )
        } else {
            problems.join("; ")
        };
        let what = if dead.len() == 1 {
            "the crashed instance or its rooms"
        } else {
            "the crashed instances or their rooms"
        };
        self.check(
            &format!("nothing under the prefix refers to {what}{ctx}"),
            ok,
            detail,
        );
        Ok(())
    }
}

//! `P:{ctl}:instance:<I>:peers`: every member `<room>/<peer>` must have a record that names
//! I (`dangling_peer_index`).

use super::findings::{Fix, Verify};
use super::read::{get, is_id, pager, text, Scan};
use super::snapshot::Seen;
use super::{ProblemKind, BATCH};
use crate::error::Result;
use crate::keys::split_peer_member;
use crate::scan::Scan as ScanOf;

/// A peer index entry to check.
struct Entry<'s> {
    inst: &'s String,
    key: String,
    room: String,
    peer: String,
    member: String,
}

impl Scan<'_> {
    /// Every `P:{ctl}:instance:<I>:peers` member `<room>/<peer>` must have a record that names
    /// I. (A record without an `instance` field is reported as `malformed_peer` instead.)
    pub(super) fn peer_indexes(&mut self, seen: &Seen) -> Result<()> {
        let owners = seen.instances_with(|s| s.peers);
        let keys = owners.iter().map(|i| self.ks.instance_peers(i)).collect();
        let mut pager = pager(keys, ScanOf::set);
        while let Some(pages) = self.pages(&mut pager)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                let key = pager.scan(n).key().to_owned();
                for m in items.unwrap_or_default() {
                    check.extend(self.peer_member(owners[n], &key, m));
                }
            }
            for chunk in check.chunks(BATCH) {
                self.check_peer_entries(chunk)?;
            }
        }
        Ok(())
    }

    /// A member of peer index `key` as an entry to check; reports one that is not
    /// `<room>/<peer>`.
    fn peer_member<'s>(&mut self, inst: &'s String, key: &str, m: Vec<u8>) -> Option<Entry<'s>> {
        let member = match text(m) {
            Ok(member) => member,
            Err(lossy) => {
                self.malformed(key, &lossy, format!("member {lossy:?} is not UTF-8"));
                return None;
            }
        };
        match split_peer_member(&member) {
            Some((r, p)) if is_id(r) && is_id(p) => Some(Entry {
                inst,
                key: key.to_owned(),
                room: r.to_owned(),
                peer: p.to_owned(),
                member: member.clone(),
            }),
            _ => {
                let detail = format!("member {member:?} is not <room>/<peer>");
                let fix = Fix::Unindex {
                    set: key.to_owned(),
                    member: member.clone(),
                    verify: Verify::Never,
                };
                self.found(
                    ProblemKind::DanglingPeerIndex,
                    key,
                    &member,
                    detail,
                    Some(fix),
                );
                None
            }
        }
    }

    /// The entry is read again first, then the record.
    fn check_peer_entries(&mut self, chunk: &[Entry<'_>]) -> Result<()> {
        let mut pipe = redis::pipe();
        for e in chunk {
            let rec = self.ks.peer(&e.room, &e.peer);
            pipe.sismember(&e.key, &e.member)
                .exists(&rec)
                .hget(&rec, "instance");
        }
        let r = self.exec(&mut pipe)?;
        for (n, e) in chunk.iter().enumerate() {
            let (Some(true), Some(exists), Some(named)) = (
                get::<bool>(r.get(3 * n)),
                get::<bool>(r.get(3 * n + 1)),
                get::<Option<String>>(r.get(3 * n + 2)),
            ) else {
                continue;
            };
            let (inst, member) = (e.inst, &e.member);
            let detail = match (exists, named) {
                (false, _) => format!("{member}: no such peer record"),
                (true, Some(other)) if other != *inst => {
                    format!("{member}: the record names instance {other}, not {inst}")
                }
                _ => continue, // ours, or malformed (reported with the record)
            };
            let fix = Fix::Unindex {
                set: e.key.clone(),
                member: member.clone(),
                verify: Verify::Peer {
                    room: e.room.clone(),
                    peer: e.peer.clone(),
                    instance: inst.clone(),
                },
            };
            self.found(
                ProblemKind::DanglingPeerIndex,
                &e.key,
                member,
                detail,
                Some(fix),
            );
        }
        Ok(())
    }
}

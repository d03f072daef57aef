//! Adversarial: a Redis failover behind a stable address (a VIP, a DNS name, a TCP load
//! balancer, or Sentinel-managed floating IP). After the failover the old master is demoted to
//! a replica and KEEPS its client connections open, answering every write with
//! `-READONLY You can't write against a read only replica.`; new connections reach the new
//! master.
//!
//! `conn.rs` keeps a connection after any server error reply (`keep_connection`: "a server's
//! error reply leaves the connection in sync"), so every worker thread and every pooled
//! connection stays glued to the read-only old master forever: the heartbeat never reaches
//! the new master (the node is invisible there, its rooms are not restored, it never leads),
//! although a fresh connection would work at once. Invariant 6: "every worker resumes within
//! two ticks".

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sfu_redis::{Node, Timings};
use support::*;

const STAGE: &str = "fo";

/// A TCP forwarder whose upstream can be switched: existing connections stay where they are,
/// new ones go to the current upstream (what a VIP / DNS switch looks like to clients).
struct Vip {
    addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
}

impl Vip {
    fn start(upstream: SocketAddr) -> Vip {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let up = Arc::new(Mutex::new(upstream));
        let up2 = Arc::clone(&up);
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                let target = *up2.lock();
                let Ok(s) = TcpStream::connect(target) else {
                    let _ = c.shutdown(Shutdown::Both);
                    continue;
                };
                for (mut from, mut to) in [(c.try_clone().unwrap(), s.try_clone().unwrap()), (s, c)]
                {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 65536];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(Shutdown::Write);
                    });
                }
            }
        });
        Vip { addr, upstream: up }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn switch(&self, to: SocketAddr) {
        *self.upstream.lock() = to;
    }
}

fn addr(s: &Server) -> SocketAddr {
    format!("127.0.0.1:{}", s.redis.port()).parse().unwrap()
}

#[test]
fn after_a_failover_behind_one_address_the_node_stays_on_the_read_only_old_master() {
    let old = Server::start();
    let new = Server::start();
    let vip = Vip::start(addr(&old));
    let a = Node::start(config_for(&vip.url(), STAGE, "inst-a", Timings::fast())).unwrap();
    a.pin_room("room").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(a.is_leader() || a.stats().heartbeats > 0);

    // Failover: the old master becomes a replica of the new one; the address now leads to
    // the new master.
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new.redis.port())
        .query(&mut old.con())
        .unwrap();
    vip.switch(addr(&new));

    // A fresh connection through the address works at once.
    let mut fresh = redis::Client::open(vip.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("probe")
        .arg("1")
        .query(&mut fresh)
        .unwrap();

    // Give the node 3 s (15 heartbeat ticks) to show up on the new master.
    let ks = ks(STAGE);
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut registered = false;
    while std::time::Instant::now() < deadline && !registered {
        let z: Option<f64> = redis::cmd("ZSCORE")
            .arg(ks.heartbeats())
            .arg("inst-a")
            .query(&mut new.con())
            .unwrap();
        registered = z.is_some();
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = a.stats();
    assert!(
        registered,
        "the node never heartbeated on the new master within 3 s (is_leader {}, heartbeat failures {}, \
         last error {:?})",
        st.is_leader, st.heartbeat_failures, st.last_error
    );
}

// The consequence for invariant 1 ("a live instance's rooms are never deleted"): a proper
// failover (the new master was a replica, so it has every key, including A's heartbeat and
// rooms). A is alive and healthy, but stuck on the old master's connections its heartbeats
// all fail with READONLY, so on the new master it looks dead; a node that connects after the
// failover leads there and reaps A's rooms and peers while A is still serving them, and A
// never hears of it (its own calls keep failing).
#[test]
fn after_a_failover_a_live_node_is_reaped_by_the_new_masters_leader() {
    let old = Server::start();
    let new = Server::start();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(old.redis.port())
        .query(&mut new.con())
        .unwrap();
    let vip = Vip::start(addr(&old));
    let a = Node::start(config_for(&vip.url(), STAGE, "inst-a", Timings::fast())).unwrap();
    a.pin_room("a-room").unwrap();
    a.upsert_peer("a-room", "a-peer", None, &[]).unwrap();
    let ks = ks(STAGE);
    // Wait until the replica has A's room.
    wait_for(LONG, "replicated", || {
        redis::cmd("EXISTS")
            .arg(ks.room("a-room").meta)
            .query::<bool>(&mut new.con())
            .ok()
            .filter(|e| *e)
    });
    // Failover: promote the replica, demote the old master, move the address.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut new.con())
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new.redis.port())
        .query(&mut old.con())
        .unwrap();
    vip.switch(addr(&new));
    // A new instance joins after the failover (fresh connections: the new master).
    let b = Node::start(config_for(&vip.url(), STAGE, "inst-b", Timings::fast())).unwrap();
    let mut lb = EventLog::new(&b);
    let reaped_a = lb.try_wait(Duration::from_secs(8), |e| reaped(e, "inst-a"));
    let a_room_left: bool = redis::cmd("EXISTS")
        .arg(ks.room("a-room").meta)
        .query(&mut new.con())
        .unwrap();
    assert!(
        reaped_a.is_none() && a_room_left,
        "live node inst-a was reaped on the new master ({reaped_a:?}); its room exists: {a_room_left}; \
         inst-a's last error: {:?}",
        a.stats().last_error
    );
}

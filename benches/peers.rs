//! Peer upsert and remove throughput, from one thread and from 8 threads sharing one `Node`.
//! Starts its own redis-server.

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sfu_redis::Node;

use common::*;

/// Operations per iteration and thread.
const OPS: usize = 200;

fn peers(c: &mut Criterion) {
    let server = server();
    let url = server.url();
    let node = Arc::new(Node::start(config(&url, "peers-bench")).expect("start"));
    for r in 0..64 {
        node.pin_room(&format!("room-{r}")).expect("pin");
    }
    let mut group = c.benchmark_group("peers");
    group.sample_size(10);
    for threads in [1usize, 8] {
        group.throughput(Throughput::Elements((threads * OPS * 2) as u64));
        group.bench_with_input(
            BenchmarkId::new("upsert_then_remove", threads),
            &threads,
            |b, &threads| {
                b.iter(|| {
                    std::thread::scope(|s| {
                        for t in 0..threads {
                            let node = Arc::clone(&node);
                            s.spawn(move || {
                                for i in 0..OPS {
                                    let room = format!("room-{}", (t * 7 + i) % 64);
                                    let peer = format!("t{t}-p{i}");
                                    let g = node
                                        .upsert_peer(
                                            &room,
                                            &peer,
                                            Some(&format!("t{t}-g{i}")),
                                            &[("k", "v")],
                                        )
                                        .expect("upsert");
                                    assert!(node.remove_peer(&room, &peer, g).expect("remove"));
                                }
                            });
                        }
                    })
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, peers);
criterion_main!(benches);

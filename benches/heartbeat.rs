//! One heartbeat tick (`Node::heartbeat_now`: the heartbeat script, then one pipelined pin
//! refresh for every owned room) with 0, 1,000 and 10,000 owned rooms, against the floor of one
//! pipelined `PEXPIRE` per pin. Starts its own redis-server.

#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sfu_redis::Node;

use common::*;

fn tick(c: &mut Criterion) {
    let server = server();
    let url = server.url();
    let ks = keyspace();
    let mut con = connect(&url);
    let mut group = c.benchmark_group("heartbeat_tick");
    group.sample_size(20);
    for rooms in [0usize, 1_000, 10_000] {
        let node = Node::start(config(&url, &format!("ticker-{rooms}"))).expect("start");
        let names: Vec<String> = (0..rooms).map(|r| format!("t{rooms}-r{r}")).collect();
        for r in &names {
            node.pin_room(r).expect("pin");
        }
        group.throughput(Throughput::Elements(rooms.max(1) as u64));
        group.bench_with_input(BenchmarkId::new("library", rooms), &rooms, |b, _| {
            b.iter(|| node.heartbeat_now().expect("tick"))
        });
        let owners: Vec<String> = names.iter().map(|r| ks.room(r).owner).collect();
        // With no rooms the floor sends nothing (an empty pipeline is not a request).
        if rooms > 0 {
            group.bench_with_input(BenchmarkId::new("floor_pexpire", rooms), &rooms, |b, _| {
                b.iter(|| {
                    let mut pipe = redis::pipe();
                    for k in &owners {
                        pipe.pexpire(k, 90_000).ignore();
                    }
                    pipe.query::<()>(&mut con).expect("PEXPIRE");
                })
            });
        }
        node.leave().expect("leave");
    }
    group.finish();
}

criterion_group!(benches, tick);
criterion_main!(benches);

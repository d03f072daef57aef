//! Reaping a dead instance with 1,000 and 10,000 rooms (4 peers each), three ways on identical
//! data: the library (`Node::reap_now`: batched SSCAN + pipelined owner-CAS scripts), the
//! seed-style baseline (SMEMBERS, then one script round trip per room), and the floor (the
//! same keys removed by pipelined UNLINK, no checks), plus the script floor (the same UNLINKs
//! inside one Lua script per room: the cost of any per-room atomic step before it checks
//! anything). Each starts its own redis-server.

#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};

use common::*;

fn reap(c: &mut Criterion) {
    let server = server();
    let url = server.url();
    let node = fast_leader(&url);
    let ks = keyspace();
    let mut con = connect(&url);
    let mut group = c.benchmark_group("reap");
    group.sample_size(10);
    for rooms in [1_000usize, 10_000] {
        group.throughput(Throughput::Elements(rooms as u64));
        group.bench_with_input(BenchmarkId::new("library", rooms), &rooms, |b, &rooms| {
            b.iter_batched(
                || {
                    fabricate(&mut connect(&url), &ks, "dead", rooms);
                },
                |()| {
                    let counts = node.reap_now("dead").expect("reap").expect("dead");
                    assert_eq!(counts.rooms as usize, rooms);
                },
                BatchSize::PerIteration,
            )
        });
        group.bench_with_input(
            BenchmarkId::new("seed_style", rooms),
            &rooms,
            |b, &rooms| {
                b.iter_batched(
                    || {
                        fabricate(&mut connect(&url), &ks, "dead", rooms);
                    },
                    |()| assert_eq!(seed_style_reap(&mut con, &ks, "dead"), rooms),
                    BatchSize::PerIteration,
                )
            },
        );
        group.bench_with_input(BenchmarkId::new("floor", rooms), &rooms, |b, &rooms| {
            b.iter_batched(
                || fabricate(&mut connect(&url), &ks, "dead", rooms),
                |keys| floor_reap(&mut con, &keys),
                BatchSize::PerIteration,
            )
        });
        group.bench_with_input(
            BenchmarkId::new("script_floor", rooms),
            &rooms,
            |b, &rooms| {
                b.iter_batched(
                    || fabricate(&mut connect(&url), &ks, "dead", rooms),
                    |keys| script_floor_reap(&mut con, &keys),
                    BatchSize::PerIteration,
                )
            },
        );
    }
    group.finish();
    node.shutdown().expect("shutdown");
}

criterion_group!(benches, reap);
criterion_main!(benches);

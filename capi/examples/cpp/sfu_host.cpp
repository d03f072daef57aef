// A small C++ program that plays one SFU instance through sfu_redis.hpp: it pins rooms, adds
// peers, prints every event as a JSON line, and runs until SIGINT/SIGTERM (or --run-ms). With
// --hammer N it also drives the node from N threads at once (pins, upserts, removes) and checks
// the results.
//
// Build it against an installed sfu-redis (from the repository root; see
// docs/src/c/install.md), with CMake (capi/examples/cpp/CMakeLists.txt) or with pkg-config:
//
//   bash capi/install.sh --prefix $HOME/.local
//   cmake -S capi/examples/cpp -B build/sfu_host -DCMAKE_PREFIX_PATH=$HOME/.local
//   cmake --build build/sfu_host              # add -DSFU_REDIS_STATIC=ON to link libsfu_redis.a
//   build/sfu_host/sfu_host --redis-url redis://127.0.0.1:6379 --instance sfu-a --rooms r1,r2 --peers 2
//
//   export PKG_CONFIG_PATH=$HOME/.local/lib/pkgconfig
//   g++ -std=c++17 capi/examples/cpp/sfu_host.cpp -o sfu_host $(pkg-config --cflags --libs sfu_redis)
//       -Wl,-rpath,$(pkg-config --variable=libdir sfu_redis)                (one line)
//
// Output (stdout, one line each, flushed): `version header=<SFU_REDIS_VERSION>
// library=<sfu_version()>`, `started <instance>`, `pinned <room> <outcome> [<other instance>]`,
// `peer <room> <peer> <generation>`, `event <json>`, `hammer ok ...` / `hammer FAILED ...`,
// `stats <instance> rooms=<n> peers=<n> leader=<0|1>`, `exit <code>`. Errors go to stderr.
// Exit status: 0 on success, 1 on an error or a failed check, 2 on bad arguments.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sfu_redis.hpp"

namespace {

std::mutex out_mutex;
volatile std::sig_atomic_t stop_requested = 0;

void on_signal(int) { stop_requested = 1; }

/// One line on stdout, whole and flushed (several threads print).
void say(const std::string &line) {
    std::lock_guard<std::mutex> lock(out_mutex);
    std::fputs(line.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}

std::vector<std::string> split(const std::string &s, char sep) {
    std::vector<std::string> out;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, sep)) {
        if (!item.empty()) {
            out.push_back(item);
        }
    }
    return out;
}

const char *outcome_name(sfu::PinOutcome o) {
    switch (o) {
    case sfu::PinOutcome::Pinned: return "pinned";
    case sfu::PinOutcome::AlreadyOurs: return "already_ours";
    case sfu::PinOutcome::TookOver: return "took_over";
    case sfu::PinOutcome::Held: return "held";
    }
    return "?";
}

struct Options {
    std::string name_space;                                    // --namespace, "" = the default
    std::vector<std::pair<std::string, std::string>> settings; // config key/values, in order
    std::vector<std::string> rooms;
    unsigned peers_per_room = 0;
    long run_ms = -1; // -1: until a signal
    unsigned hammer_threads = 0;
    unsigned hammer_ops = 40;
    bool poll = false;
    bool leave = false;
};

void usage() {
    std::fputs("usage: sfu_host [--redis-url URL] [--namespace NS] [--stage S] [--instance ID]\n"
               "                [--timings default|fast|from_heartbeat:<interval_ms>,<ttl_ms>]\n"
               "                [--set key=value]... [--rooms r1,r2] [--peers N] [--run-ms MS]\n"
               "                [--hammer THREADS] [--ops N] [--poll] [--leave]\n",
               stderr);
}

bool parse(int argc, char **argv, Options &o) {
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&](std::string &out) {
            if (i + 1 >= argc) {
                return false;
            }
            out = argv[++i];
            return true;
        };
        std::string v;
        if (a == "--poll") {
            o.poll = true;
        } else if (a == "--leave") {
            o.leave = true;
        } else if (!value(v)) {
            return false;
        } else if (a == "--redis-url") {
            o.settings.emplace_back("redis_url", v);
        } else if (a == "--namespace") {
            o.name_space = v;
        } else if (a == "--stage") {
            o.settings.emplace_back("stage", v);
        } else if (a == "--instance") {
            o.settings.emplace_back("instance_id", v);
        } else if (a == "--timings") {
            o.settings.emplace_back("timings", v);
        } else if (a == "--set") {
            auto eq = v.find('=');
            if (eq == std::string::npos) {
                return false;
            }
            o.settings.emplace_back(v.substr(0, eq), v.substr(eq + 1));
        } else if (a == "--rooms") {
            o.rooms = split(v, ',');
        } else if (a == "--peers") {
            o.peers_per_room = static_cast<unsigned>(std::stoul(v));
        } else if (a == "--run-ms") {
            o.run_ms = std::stol(v);
        } else if (a == "--hammer") {
            o.hammer_threads = static_cast<unsigned>(std::stoul(v));
        } else if (a == "--ops") {
            o.hammer_ops = static_cast<unsigned>(std::stoul(v));
        } else {
            return false;
        }
    }
    return true;
}

/// What the hammer threads did, checked at the end.
struct HammerLog {
    std::mutex m;
    std::map<std::string, std::set<std::uint64_t>> generations; // room -> generations seen
    std::map<std::string, std::uint64_t> kept;                   // "room/peer" -> generation
    std::vector<std::string> failures;

    void fail(const std::string &why) {
        std::lock_guard<std::mutex> lock(m);
        failures.push_back(why);
    }
};

/// One hammer thread: its own rooms plus one room shared by every thread. Each op upserts a
/// peer; every other one is removed again (with its generation, then a stale remove that must
/// be a no-op).
void hammer_thread(sfu::Node &node, unsigned t, unsigned ops, HammerLog &log) {
    try {
        const std::string shared = "hammer-shared";
        for (unsigned i = 0; i < ops; ++i) {
            std::string room = (i % 3 == 0) ? shared : "hammer-t" + std::to_string(t) + "-r" + std::to_string(i % 4);
            auto pin = node.pin_room(room);
            if (!pin.owned()) {
                log.fail("pin " + room + " not owned: held by " + pin.other);
                continue;
            }
            std::string peer = "t" + std::to_string(t) + "-p" + std::to_string(i);
            std::string guest = "t" + std::to_string(t) + "-g" + std::to_string(i);
            auto up = node.upsert_peer_detailed(room, peer, guest, {{"thread", std::to_string(t)}, {"op", std::to_string(i)}});
            if (up.generation == 0 || up.replaced) {
                log.fail("upsert " + room + "/" + peer + ": generation 0 or replaced a peer");
            }
            {
                std::lock_guard<std::mutex> lock(log.m);
                if (!log.generations[room].insert(up.generation).second) {
                    log.failures.push_back("duplicate generation " + std::to_string(up.generation) + " in " + room);
                }
            }
            if (i % 2 == 1) {
                if (node.remove_peer(room, peer, up.generation + 1000000)) {
                    log.fail("remove with a wrong generation removed " + room + "/" + peer);
                }
                if (!node.remove_peer(room, peer, up.generation)) {
                    log.fail("remove " + room + "/" + peer + " was a no-op");
                }
                if (node.remove_peer(room, peer, up.generation)) {
                    log.fail("second remove of " + room + "/" + peer + " removed something");
                }
            } else {
                std::lock_guard<std::mutex> lock(log.m);
                log.kept[room + "/" + peer] = up.generation;
            }
            // A room owned by this node must read back as ours.
            auto owner = node.room_owner(room);
            if (!owner) {
                log.fail("room " + room + " has no owner");
            }
        }
    } catch (const sfu::Error &e) {
        log.fail(std::string("thread ") + std::to_string(t) + ": " + e.what());
    }
}

/// Runs the hammer and prints `hammer ok ...` or `hammer FAILED ...`; returns success.
bool hammer(sfu::Node &node, unsigned threads, unsigned ops, std::uint64_t peers_before) {
    HammerLog log;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
        pool.emplace_back(hammer_thread, std::ref(node), t, ops, std::ref(log));
    }
    for (auto &th : pool) {
        th.join();
    }
    const std::string me = node.instance_id();
    std::set<std::string> rooms;
    for (const auto &r : log.generations) {
        rooms.insert(r.first);
        auto owner = node.room_owner(r.first);
        if (!owner || *owner != me) {
            log.failures.push_back("room " + r.first + " is not owned by " + me);
        }
    }
    auto stats = node.stats();
    if (stats.peers != peers_before + log.kept.size()) {
        log.failures.push_back("stats.peers = " + std::to_string(stats.peers) + ", expected " +
                               std::to_string(peers_before + log.kept.size()));
    }
    if (!log.failures.empty()) {
        std::string line = "hammer FAILED (" + std::to_string(log.failures.size()) + " problems):";
        for (std::size_t i = 0; i < log.failures.size() && i < 10; ++i) {
            line += " [" + log.failures[i] + "]";
        }
        say(line);
        return false;
    }
    say("hammer ok threads=" + std::to_string(threads) + " ops=" + std::to_string(threads * ops) +
        " rooms=" + std::to_string(rooms.size()) + " kept=" + std::to_string(log.kept.size()));
    return true;
}

int run(const Options &o) {
    // Declared before the node: its handler writes it until the node is destroyed.
    std::atomic<bool> stopped_event{false};
    // The header this program was compiled with, and the library it runs with.
    say(std::string("version header=") + SFU_REDIS_VERSION + " library=" + sfu::version());
    sfu::Config config;
    if (!o.name_space.empty()) {
        config.namespace_(o.name_space);
    }
    for (const auto &kv : o.settings) {
        config.set(kv.first, kv.second);
    }
    sfu::Node node(config);
    const std::string me = node.instance_id();
    say("started " + me);

    if (!o.poll) {
        node.on_event([&stopped_event](const sfu::Event &e) {
            say("event " + e.json);
            if (e.kind == sfu::EventKind::Stopped) {
                stopped_event = true;
            }
        });
    }
    auto drain = [&](std::chrono::milliseconds wait) {
        if (!o.poll) {
            return;
        }
        while (auto e = node.next_event(wait)) {
            say("event " + e->json);
            if (e->kind == sfu::EventKind::Stopped) {
                stopped_event = true;
                return;
            }
            wait = std::chrono::milliseconds(0);
        }
    };

    for (const auto &room : o.rooms) {
        auto pin = node.pin_room(room);
        say("pinned " + room + " " + outcome_name(pin.outcome) + (pin.other.empty() ? "" : " " + pin.other));
        if (!pin.owned()) {
            continue;
        }
        for (unsigned k = 1; k <= o.peers_per_room; ++k) {
            std::string peer = room + "-p" + std::to_string(k);
            std::uint64_t gen = node.upsert_peer(room, peer, room + "-g" + std::to_string(k), {{"name", "peer " + std::to_string(k)}});
            say("peer " + room + " " + peer + " " + std::to_string(gen));
        }
    }
    node.ready();

    bool ok = true;
    if (o.hammer_threads > 0) {
        ok = hammer(node, o.hammer_threads, o.hammer_ops, node.stats().peers);
    }

    auto start = std::chrono::steady_clock::now();
    while (!stop_requested) {
        if (o.run_ms >= 0 && std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(o.run_ms)) {
            break;
        }
        if (o.poll) {
            drain(std::chrono::milliseconds(50));
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }

    auto stats = node.stats();
    say("stats " + stats.instance_id + " rooms=" + std::to_string(stats.rooms) + " peers=" + std::to_string(stats.peers) +
        " leader=" + (stats.is_leader ? "1" : "0") + " reaped=" + std::to_string(stats.instances_reaped));
    // What a host's own /metrics and /healthz endpoints would serve.
    const auto health = node.health();
    say(std::string("health ") + (health.ok ? "ok" : "FAILED") + ": " + health.reason);
    const std::string exposition = node.metrics();
    std::istringstream lines(exposition);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("sfu_redis_rooms ", 0) == 0 || line.rfind("sfu_redis_peers ", 0) == 0) {
            say("metrics " + line);
        }
    }
    if (o.leave) {
        node.leave();
    } else {
        node.stop();
    }
    drain(std::chrono::milliseconds(1000));
    // The handler sees the Stopped event no later than the node's destruction, which waits
    // for the event thread.
    return ok ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
    Options o;
    try {
        if (!parse(argc, argv, o)) {
            usage();
            return 2;
        }
    } catch (const std::exception &) {
        usage();
        return 2;
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    int code = 1;
    try {
        code = run(o);
    } catch (const sfu::Error &e) {
        std::fprintf(stderr, "sfu_host: %s (status %u)\n", e.what(), static_cast<unsigned>(e.status()));
        code = 1;
    }
    say("exit " + std::to_string(code));
    return code;
}

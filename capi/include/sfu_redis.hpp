// sfu-redis C++17 wrapper: header-only RAII over the C API of sfu_redis.h.
//
//   sfu::Config config;
//   config.redis_url("redis://127.0.0.1:6379").stage("prod");
//   sfu::Node node(config);                       // throws sfu::Error on failure
//   auto pin = node.pin_room("room-1");
//   if (pin.owned()) {
//       uint64_t gen = node.upsert_peer("room-1", "peer-1", "guest-1", {{"name", "Ada"}});
//       node.remove_peer("room-1", "peer-1", gen);
//   }
//   node.on_event([](const sfu::Event &e) { std::puts(e.json.c_str()); });  // library thread
//
// - Config and Node are move-only; the destructor releases the C object (a Node's destructor
//   stops it first, like sfu_node_stop, and waits for its event handler to finish).
// - Strings go in and out as std::string (UTF-8); nothing to free by hand.
// - Every failure throws sfu::Error, carrying the C status code (status()) and the library's
//   message (message()).
// - Link with -lsfu_redis, or let the installed package do it (capi/install.sh): pkg-config
//   `sfu_redis`, or CMake find_package(sfu_redis CONFIG) with the targets sfu_redis::sfu_redis
//   (shared) and sfu_redis::sfu_redis_static (libsfu_redis.a and the system libraries it needs).
//
// Threads: a Node may be used from several threads at once. An event handler runs on the
// library's event thread (see sfu_node_set_event_callback in sfu_redis.h): it must return
// quickly; an exception escaping it is caught and printed to stderr, never propagated; and
// stop(), leave(), on_event(), next_event() or destroying a Node from inside a handler throw
// (or, for the destructor, leak the node) with SFU_ERR_IN_CALLBACK instead of deadlocking.
#ifndef SFU_REDIS_HPP
#define SFU_REDIS_HPP

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sfu_redis.h"

namespace sfu {

/// A failed call: the C status code and the library's message.
class Error : public std::runtime_error {
public:
    Error(SfuStatus status, const std::string &message)
        : std::runtime_error(std::string(sfu_status_name(status)) + ": " + message),
          status_(status), message_(message) {}

    /// The status code (SFU_ERR_...), stable across versions.
    SfuStatus status() const noexcept { return status_; }
    /// The message alone (what() is "SFU_ERR_NAME: message").
    const std::string &message() const noexcept { return message_; }

private:
    SfuStatus status_;
    std::string message_;
};

namespace detail {

inline void check(SfuStatus status) {
    if (status != SFU_OK) {
        throw Error(status, sfu_last_error_message());
    }
}

/// Takes ownership of a library string (NULL = none) and frees it.
inline std::optional<std::string> take(char *s) {
    if (s == nullptr) {
        return std::nullopt;
    }
    std::string out(s);
    sfu_string_free(s);
    return out;
}

inline std::string str_or_empty(const char *s) { return s == nullptr ? std::string() : std::string(s); }

} // namespace detail

/// The version of the library loaded at run time ("0.1.0"); the header's own version is
/// SFU_REDIS_VERSION (and SFU_REDIS_VERSION_MAJOR, _MINOR, _PATCH) from sfu_redis.h.
inline std::string version() { return sfu_version(); }

/// A configuration: key/value settings (see SfuConfig in sfu_redis.h for the keys).
class Config {
public:
    /// The defaults: memory-only, prefix sfu:dev:main, a generated instance id, default timings.
    Config() { detail::check(sfu_config_new(&config_)); }

    /// The defaults overridden by REDIS_URL, SFU_NAMESPACE, SFU_STAGE, SFU_BRANCH and
    /// SFU_INSTANCE_ID.
    static Config from_env() {
        SfuConfig *c = nullptr;
        detail::check(sfu_config_from_env(&c));
        return Config(c);
    }

    Config(const Config &) = delete;
    Config &operator=(const Config &) = delete;
    Config(Config &&other) noexcept : config_(std::exchange(other.config_, nullptr)) {}
    Config &operator=(Config &&other) noexcept {
        if (this != &other) {
            sfu_config_free(config_);
            config_ = std::exchange(other.config_, nullptr);
        }
        return *this;
    }
    ~Config() { sfu_config_free(config_); }

    /// Sets any key ("redis_url", "stage", "timings", "heartbeat_interval_ms", ...).
    Config &set(const std::string &key, const std::string &value) {
        detail::check(sfu_config_set(config_, key.c_str(), value.c_str()));
        return *this;
    }
    /// Sets a timing key ("heartbeat_interval_ms", ...) in milliseconds.
    Config &set_ms(const std::string &key, std::uint64_t ms) {
        detail::check(sfu_config_set_ms(config_, key.c_str(), ms));
        return *this;
    }
    /// redis://[user:password@]host:port[/db]; empty = memory-only mode.
    Config &redis_url(const std::string &url) { return set("redis_url", url); }
    /// The first part of every key, <namespace>:<stage>:<branch> ("sfu" by default). Named
    /// with a trailing underscore because `namespace` is a C++ keyword; the key is "namespace".
    Config &namespace_(const std::string &v) { return set("namespace", v); }
    Config &stage(const std::string &v) { return set("stage", v); }
    Config &branch(const std::string &v) { return set("branch", v); }
    Config &instance_id(const std::string &v) { return set("instance_id", v); }
    /// One of three presets: "default"; "fast" (millisecond timings for tests and demos); or
    /// "from_heartbeat:<interval_ms>,<ttl_ms>", every timing derived from the heartbeat's
    /// interval and TTL (as Timings::from_heartbeat in Rust). A preset replaces every timing;
    /// set single ones after it with set_ms.
    Config &timings(const std::string &preset) { return set("timings", preset); }

    /// Throws sfu::Error (SFU_ERR_INVALID_CONFIG, naming the field) if the node would refuse it.
    void validate() const { detail::check(sfu_config_validate(config_)); }

    const SfuConfig *get() const noexcept { return config_; }

private:
    explicit Config(SfuConfig *c) noexcept : config_(c) {}
    SfuConfig *config_ = nullptr;
};

enum class PinOutcome : std::uint32_t {
    Pinned = SFU_PIN_PINNED,
    AlreadyOurs = SFU_PIN_ALREADY_OURS,
    TookOver = SFU_PIN_TOOK_OVER,
    Held = SFU_PIN_HELD,
};

/// What pin_room did.
struct PinResult {
    PinOutcome outcome;
    /// Held: the owner (redirect the client there); TookOver: the previous owner; else empty.
    std::string other;
    /// True when this instance owns the room after the call.
    bool owned() const noexcept { return outcome != PinOutcome::Held; }
};

/// What upsert_peer_detailed did.
struct Upserted {
    std::uint64_t generation;
    /// Another peer of the same guest that this upsert replaced (tear its transport down).
    std::optional<std::string> replaced;
};

enum class EventKind : std::uint32_t {
    None = SFU_EVENT_NONE,
    Ready = SFU_EVENT_READY,
    LeaderAcquired = SFU_EVENT_LEADER_ACQUIRED,
    LeaderLost = SFU_EVENT_LEADER_LOST,
    Candidates = SFU_EVENT_CANDIDATES,
    InstanceReaped = SFU_EVENT_INSTANCE_REAPED,
    RoomLost = SFU_EVENT_ROOM_LOST,
    ReapedSelf = SFU_EVENT_REAPED_SELF,
    Stopped = SFU_EVENT_STOPPED,
};

enum class LeaderLostReason : std::uint32_t {
    None = SFU_LEADER_LOST_NONE,
    RefreshFailed = SFU_LEADER_LOST_REFRESH_FAILED,
    DeadlinePassed = SFU_LEADER_LOST_DEADLINE_PASSED,
    LeaseTaken = SFU_LEADER_LOST_LEASE_TAKEN,
    Shutdown = SFU_LEADER_LOST_SHUTDOWN,
};

/// One event, copied out of the C struct (see SfuEvent for which field goes with which kind).
struct Event {
    EventKind kind = EventKind::None;
    std::uint64_t epoch = 0;
    LeaderLostReason reason = LeaderLostReason::None;
    std::uint64_t rooms = 0;
    std::uint64_t peers = 0;
    std::uint64_t skipped_rooms = 0;
    /// InstanceReaped: the dead instance.
    std::string instance;
    /// RoomLost: the room.
    std::string room;
    /// RoomLost: the new owner, if any.
    std::optional<std::string> new_owner;
    /// Candidates: instance ids; ReapedSelf: room ids.
    std::vector<std::string> ids;
    /// The event as one JSON line (what `sfu-redis node --json` prints).
    std::string json;

    static Event from_c(const SfuEvent &e) {
        Event out;
        out.kind = static_cast<EventKind>(e.kind);
        out.epoch = e.epoch;
        out.reason = static_cast<LeaderLostReason>(e.reason);
        out.rooms = e.rooms;
        out.peers = e.peers;
        out.skipped_rooms = e.skipped_rooms;
        out.instance = detail::str_or_empty(e.instance);
        out.room = detail::str_or_empty(e.room);
        if (e.new_owner != nullptr) {
            out.new_owner = std::string(e.new_owner);
        }
        for (std::size_t i = 0; i < e.ids_len; ++i) {
            out.ids.emplace_back(e.ids[i]);
        }
        out.json = detail::str_or_empty(e.json);
        return out;
    }
};

/// A snapshot of a node's state and counters.
struct Stats {
    std::string instance_id;
    bool redis = false;
    bool is_leader = false;
    std::uint64_t epoch = 0; ///< 0 when not leading
    std::uint64_t rooms = 0;
    std::uint64_t peers = 0;
    std::uint64_t heartbeats = 0;
    std::uint64_t heartbeat_failures = 0;
    std::int64_t last_heartbeat_age_ms = -1; ///< -1: none yet
    std::uint64_t redis_errors = 0;
    std::uint64_t bad_data = 0;
    std::optional<std::string> last_error;
    std::uint64_t instances_reaped = 0;
    std::uint64_t rooms_reaped = 0;
    std::uint64_t peers_reaped = 0;
    std::uint64_t events_dropped = 0;
};

/// Whether a node is healthy (Node::health): what a host's /healthz answers, 200 when ok,
/// 503 otherwise, with the reason as body.
struct Health {
    bool ok = false;
    std::string reason;
};

/// Receives every event on the library's event thread (see Node::on_event).
using EventHandler = std::function<void(const Event &)>;

namespace detail {

extern "C" inline void sfu_hpp_event_trampoline(void *user_data, const SfuEvent *event) {
    // Nothing may unwind into the library: every exception stops here.
    try {
        (*static_cast<EventHandler *>(user_data))(Event::from_c(*event));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "sfu-redis: an event handler threw: %s\n", e.what());
    } catch (...) {
        std::fprintf(stderr, "sfu-redis: an event handler threw a non-std exception\n");
    }
}

extern "C" inline void sfu_hpp_event_finalizer(void *user_data) {
    delete static_cast<EventHandler *>(user_data);
}

} // namespace detail

/// One SFU instance (move-only). Constructing it starts the node; destroying it stops and
/// frees it.
class Node {
public:
    /// Starts a node (connects and registers, or memory-only without a Redis URL).
    explicit Node(const Config &config) { detail::check(sfu_node_start(config.get(), &node_)); }

    Node(const Node &) = delete;
    Node &operator=(const Node &) = delete;
    Node(Node &&other) noexcept : node_(std::exchange(other.node_, nullptr)) {}
    Node &operator=(Node &&other) noexcept {
        if (this != &other) {
            release();
            node_ = std::exchange(other.node_, nullptr);
        }
        return *this;
    }
    ~Node() { release(); }

    std::string instance_id() const {
        char *s = nullptr;
        detail::check(sfu_node_instance_id(node_, &s));
        return detail::take(s).value_or(std::string());
    }

    PinResult pin_room(const std::string &room) {
        SfuPinOutcome outcome = SFU_PIN_PINNED;
        char *other = nullptr;
        detail::check(sfu_node_pin_room(node_, room.c_str(), &outcome, &other));
        return PinResult{static_cast<PinOutcome>(outcome), detail::take(other).value_or(std::string())};
    }

    void close_room(const std::string &room) { detail::check(sfu_node_close_room(node_, room.c_str())); }

    /// The instance whose pin the room carries, if any.
    std::optional<std::string> room_owner(const std::string &room) const {
        char *owner = nullptr;
        detail::check(sfu_node_room_owner(node_, room.c_str(), &owner));
        return detail::take(owner);
    }

    using Fields = std::vector<std::pair<std::string, std::string>>;

    /// Writes a peer of a room this instance owns; returns its generation.
    std::uint64_t upsert_peer(const std::string &room, const std::string &peer,
                              const std::optional<std::string> &guest = std::nullopt,
                              const Fields &fields = {}) {
        return upsert_peer_detailed(room, peer, guest, fields).generation;
    }

    /// Without a guest id: `upsert_peer(room, peer, {{"name", "Ada"}})`. (These overloads keep
    /// a field list in the third place from binding to the guest's `std::string`, which has a
    /// two-pointer constructor.)
    std::uint64_t upsert_peer(const std::string &room, const std::string &peer, const Fields &fields) {
        return upsert_peer_detailed(room, peer, std::nullopt, fields).generation;
    }
    std::uint64_t upsert_peer(const std::string &room, const std::string &peer,
                              std::initializer_list<std::pair<std::string, std::string>> fields) {
        return upsert_peer_detailed(room, peer, std::nullopt, Fields(fields)).generation;
    }
    Upserted upsert_peer_detailed(const std::string &room, const std::string &peer, const Fields &fields) {
        return upsert_peer_detailed(room, peer, std::nullopt, fields);
    }
    Upserted upsert_peer_detailed(const std::string &room, const std::string &peer,
                                  std::initializer_list<std::pair<std::string, std::string>> fields) {
        return upsert_peer_detailed(room, peer, std::nullopt, Fields(fields));
    }

    Upserted upsert_peer_detailed(const std::string &room, const std::string &peer,
                                  const std::optional<std::string> &guest = std::nullopt,
                                  const Fields &fields = {}) {
        std::vector<SfuField> c_fields;
        c_fields.reserve(fields.size());
        for (const auto &f : fields) {
            c_fields.push_back(SfuField{f.first.c_str(), f.second.c_str()});
        }
        std::uint64_t generation = 0;
        char *replaced = nullptr;
        detail::check(sfu_node_upsert_peer(node_, room.c_str(), peer.c_str(),
                                           guest ? guest->c_str() : nullptr,
                                           c_fields.empty() ? nullptr : c_fields.data(),
                                           c_fields.size(), &generation, &replaced));
        return Upserted{generation, detail::take(replaced)};
    }

    /// Removes a peer if its record still carries `generation`; false = no-op.
    bool remove_peer(const std::string &room, const std::string &peer, std::uint64_t generation) {
        bool removed = false;
        detail::check(sfu_node_remove_peer(node_, room.c_str(), peer.c_str(), generation, &removed));
        return removed;
    }

    bool is_leader() const {
        bool leader = false;
        detail::check(sfu_node_is_leader(node_, &leader));
        return leader;
    }

    Stats stats() const {
        SfuStats s{};
        detail::check(sfu_node_stats(node_, &s));
        Stats out;
        out.instance_id = detail::str_or_empty(s.instance_id);
        out.redis = s.redis;
        out.is_leader = s.is_leader;
        out.epoch = s.epoch;
        out.rooms = s.rooms;
        out.peers = s.peers;
        out.heartbeats = s.heartbeats;
        out.heartbeat_failures = s.heartbeat_failures;
        out.last_heartbeat_age_ms = s.last_heartbeat_age_ms;
        out.redis_errors = s.redis_errors;
        out.bad_data = s.bad_data;
        if (s.last_error != nullptr) {
            out.last_error = std::string(s.last_error);
        }
        out.instances_reaped = s.instances_reaped;
        out.rooms_reaped = s.rooms_reaped;
        out.peers_reaped = s.peers_reaped;
        out.events_dropped = s.events_dropped;
        sfu_stats_clear(&s);
        return out;
    }

    /// The node's metrics in the Prometheus text format 0.0.4 (serve it with the content type
    /// "text/plain; version=0.0.4; charset=utf-8" on the host's own /metrics endpoint).
    std::string metrics() const {
        char *s = nullptr;
        detail::check(sfu_node_metrics(node_, &s));
        return detail::take(s).value_or(std::string());
    }

    /// Healthy when the last successful heartbeat is younger than the heartbeat TTL (always in
    /// memory-only mode; never after stop()).
    Health health() const {
        bool ok = false;
        char *reason = nullptr;
        detail::check(sfu_node_health(node_, &ok, &reason));
        return Health{ok, detail::take(reason).value_or(std::string())};
    }

    /// Emits the Ready event (call once the start-up pins and peers are written).
    void ready() { detail::check(sfu_node_ready(node_)); }

    /// Stops the threads and releases the lease; rooms stay for the reaper. Idempotent.
    void stop() { detail::check(sfu_node_stop(node_)); }

    /// Leaves the cluster for good (closes this node's rooms and peers, deregisters).
    void leave() { detail::check(sfu_node_leave(node_)); }

    /// The next event, waiting up to `timeout`; std::nullopt when none came in time. Throws
    /// sfu::Error with SFU_ERR_CLOSED after the Stopped event, and
    /// SFU_ERR_CALLBACK_REGISTERED while a handler is registered.
    std::optional<Event> next_event(std::chrono::milliseconds timeout) {
        auto ms = timeout.count() < 0 ? 0 : timeout.count();
        if (ms > static_cast<long long>(UINT32_MAX)) {
            ms = static_cast<long long>(UINT32_MAX);
        }
        SfuEvent e{};
        SfuStatus st = sfu_node_next_event(node_, static_cast<std::uint32_t>(ms), &e);
        if (st == SFU_ERR_TIMEOUT) {
            return std::nullopt;
        }
        detail::check(st);
        Event out;
        try {
            out = Event::from_c(e);
        } catch (...) {
            sfu_event_clear(&e);
            throw;
        }
        sfu_event_clear(&e);
        return out;
    }

    /// Registers `handler` for every event (replacing the previous one); an empty function
    /// removes it. The handler runs on the library's event thread and is destroyed there once
    /// it will not be called again.
    void on_event(EventHandler handler) {
        if (!handler) {
            detail::check(sfu_node_set_event_callback(node_, nullptr, nullptr, nullptr));
            return;
        }
        auto owned = std::make_unique<EventHandler>(std::move(handler));
        detail::check(sfu_node_set_event_callback(node_, &detail::sfu_hpp_event_trampoline,
                                                  owned.get(), &detail::sfu_hpp_event_finalizer));
        owned.release(); // now the library's: the finalizer deletes it
    }

    /// The C handle, for calls the wrapper does not cover. Do not free it.
    SfuNode *get() const noexcept { return node_; }

private:
    void release() noexcept {
        if (node_ == nullptr) {
            return;
        }
        if (sfu_node_free(node_) == SFU_ERR_IN_CALLBACK) {
            // Destroying a Node inside its own handler would wait for the handler's thread:
            // refused by the library, so the node is leaked rather than deadlocked.
            std::fprintf(stderr, "sfu-redis: a Node was destroyed inside an event handler and leaked: %s\n",
                         sfu_last_error_message());
        }
        node_ = nullptr;
    }

    SfuNode *node_ = nullptr;
};

} // namespace sfu

#endif // SFU_REDIS_HPP

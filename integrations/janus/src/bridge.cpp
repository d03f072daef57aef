// The queue, the worker and the node (see bridge.hpp).
#include "bridge.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <random>
#include <system_error>
#include <utility>

#include <pthread.h>

#include "log.hpp"

namespace sfuredis {

namespace {

using Clock = std::chrono::steady_clock;

/// At most one "queue full" line per this period; the lines in between are counted in the
/// next one.
constexpr auto DROP_LOG_PERIOD = std::chrono::seconds(1);
/// A job still failing on Redis is logged at its first error and then every this many.
constexpr unsigned RETRY_LOG_EVERY = 10;

std::uint64_t get(const std::atomic<std::uint64_t> &a) { return a.load(std::memory_order_relaxed); }
void bump(std::atomic<std::uint64_t> &a) { a.fetch_add(1, std::memory_order_relaxed); }

json_t *error_reply(int code, const std::string &message) {
    json_t *out = json_object();
    json_object_set_new(out, "error_code", json_integer(code));
    json_object_set_new(out, "error", json_string(message.c_str()));
    return out;
}

json_t *u64(std::uint64_t v) { return json_integer(static_cast<json_int_t>(v)); }

std::uint64_t micros(Clock::duration d) {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(
        0, std::chrono::duration_cast<std::chrono::microseconds>(d).count()));
}

} // namespace

struct Shared {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<Job> queue;
    std::size_t capacity = DEFAULT_QUEUE_CAPACITY;
    std::size_t max_depth = 0;
    bool in_flight = false;
    bool stopping = false;
    std::string last_error;
    std::string instance;
    bool connected = false;
    // "queue full" lines
    Clock::time_point last_drop_line{};
    std::uint64_t drops_unreported = 0;

    std::atomic<std::uint64_t> received{0};
    std::atomic<std::uint64_t> handled{0};
    std::atomic<std::uint64_t> dropped{0};
    std::atomic<std::uint64_t> bad_events{0};
    std::atomic<std::uint64_t> failed{0};
    std::atomic<std::uint64_t> redis_retries{0};
    std::atomic<std::uint64_t> rooms_held{0};
    std::atomic<std::uint64_t> joins_not_recorded{0};
    std::atomic<std::uint64_t> replaced{0};
    std::atomic<std::uint64_t> start_failures{0};
    std::atomic<std::uint64_t> discarded_at_stop{0};
    /// Microseconds the worker spent applying jobs (Redis calls, and backoff waits on Redis
    /// errors), and that jobs spent queued before it took them.
    std::atomic<std::uint64_t> busy_us{0};
    std::atomic<std::uint64_t> queue_wait_us{0};

    void note_error(const std::string &e) {
        std::lock_guard<std::mutex> lock(mutex);
        last_error = e;
    }

    /// Queues a job of the handler's own (not counted as received, never dropped).
    void push_internal(Job job) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            if (stopping) {
                return;
            }
            queue.push_back(std::move(job));
            max_depth = std::max(max_depth, queue.size() + (in_flight ? 1 : 0));
        }
        wake.notify_one();
    }

    /// The "queue full" summary for drops not reported yet (called by the worker).
    void report_drops() {
        std::uint64_t n = 0;
        {
            std::lock_guard<std::mutex> lock(mutex);
            n = std::exchange(drops_unreported, 0);
            if (n > 0) {
                last_drop_line = Clock::now();
            }
        }
        if (n > 0) {
            log(LOG_WARN, std::to_string(n) + " more event(s) dropped while the queue was full (" +
                              std::to_string(get(dropped)) + " dropped in all)");
        }
    }
};

namespace {

/// The library's events, on its event thread: logged; a room this instance no longer holds is
/// forgotten by the worker.
void on_library_event(const std::shared_ptr<Shared> &shared, const sfu::Event &e) {
    switch (e.kind) {
    case sfu::EventKind::RoomLost: {
        log(LOG_WARN, "room " + e.room + " is no longer this instance's (" +
                          (e.new_owner ? "now held by " + *e.new_owner : std::string("no owner")) +
                          "): its participants here are no longer recorded");
        Job job;
        job.kind = JobKind::ForgetRoom;
        job.room = e.room;
        job.queued = Clock::now();
        shared->push_internal(std::move(job));
        return;
    }
    case sfu::EventKind::ReapedSelf:
        log(LOG_ERR, "this instance was reaped while unresponsive: " + std::to_string(e.rooms) +
                         " room(s) lost; it registered again: " + e.json);
        for (const auto &room : e.ids) {
            Job job;
            job.kind = JobKind::ForgetRoom;
            job.room = room;
            job.queued = Clock::now();
            shared->push_internal(std::move(job));
        }
        return;
    case sfu::EventKind::InstanceReaped:
    case sfu::EventKind::LeaderAcquired:
    case sfu::EventKind::LeaderLost:
    case sfu::EventKind::Stopped:
        log(LOG_INFO, "event " + e.json);
        return;
    default:
        log(LOG_VERB, "event " + e.json);
        return;
    }
}

} // namespace

Bridge::Bridge(Settings settings) : settings_(std::move(settings)), shared_(std::make_shared<Shared>()) {
    shared_->capacity = settings_.queue_capacity;
    // The worker makes blocking Redis calls: it blocks the asynchronous signals, so Janus's
    // SIGINT/SIGTERM handler runs on one of Janus's threads and never interrupts a read here.
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    for (int sync : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT}) {
        sigdelset(&all, sync);
    }
    pthread_sigmask(SIG_BLOCK, &all, &previous);
    try {
        worker_ = std::thread([this] { run(); });
    } catch (...) {
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
        throw;
    }
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

Bridge::~Bridge() { shutdown(); }

std::shared_ptr<sfu::Node> Bridge::node() const {
    std::lock_guard<std::mutex> lock(node_mutex_);
    return node_;
}

void Bridge::submit(Job job) noexcept {
    try {
        bump(shared_->received);
        std::string line;
        {
            std::lock_guard<std::mutex> lock(shared_->mutex);
            if (shared_->stopping) {
                return;
            }
            std::size_t depth = shared_->queue.size() + (shared_->in_flight ? 1 : 0);
            if (depth >= shared_->capacity) {
                bump(shared_->dropped);
                auto now = Clock::now();
                if (now - shared_->last_drop_line >= DROP_LOG_PERIOD) {
                    std::uint64_t before = std::exchange(shared_->drops_unreported, 0);
                    shared_->last_drop_line = now;
                    line = "queue full (" + std::to_string(shared_->capacity) +
                           " events waiting for Redis): dropped " + job.describe();
                    if (before > 0) {
                        line += ", and " + std::to_string(before) + " more since the last line";
                    }
                    line += " (" + std::to_string(get(shared_->dropped)) + " dropped in all)";
                } else {
                    shared_->drops_unreported += 1;
                }
            } else {
                shared_->queue.push_back(std::move(job));
                shared_->max_depth = std::max(shared_->max_depth, depth + 1);
            }
        }
        if (!line.empty()) {
            log(LOG_WARN, line);
        }
        shared_->wake.notify_one();
    } catch (...) {
        // Out of memory: the event is lost, Janus goes on.
        bump(shared_->dropped);
    }
}

void Bridge::reject(const std::string &why) noexcept {
    bump(shared_->bad_events);
    log(LOG_WARN, "ignored " + why);
}

bool Bridge::backoff(unsigned attempt) {
    using namespace std::chrono;
    auto base = milliseconds(100) * (1u << std::min(attempt, 6u));
    base = std::min<milliseconds>(base, milliseconds(5000));
    static thread_local std::minstd_rand rng{std::random_device{}()};
    std::uniform_int_distribution<long> jitter(-base.count() / 5, base.count() / 5);
    auto wait = base + milliseconds(jitter(rng));
    std::unique_lock<std::mutex> lock(shared_->mutex);
    return !shared_->wake.wait_for(lock, wait, [&] { return shared_->stopping; });
}

namespace {

/// Says in the log that a registration is taking long, while it does. sfu_node_start waits
/// when a process that ran with the same instance_id ended without stopping (killed, crashed)
/// less than a heartbeat TTL ago: its heartbeat must expire first (at most the heartbeat TTL
/// plus one interval, 40 s at the default timings). Without this the handler would be silent
/// for that long. The first line comes after REGISTRATION_QUIET, then one every
/// REGISTRATION_LOG_EVERY until the registration returns.
class RegistrationWatch {
  public:
    static constexpr auto REGISTRATION_QUIET = std::chrono::seconds(1);
    static constexpr auto REGISTRATION_LOG_EVERY = std::chrono::seconds(10);

    RegistrationWatch() : thread_([this] { watch(); }) {}
    ~RegistrationWatch() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            done_ = true;
        }
        cv_.notify_one();
        thread_.join();
    }
    RegistrationWatch(const RegistrationWatch &) = delete;
    RegistrationWatch &operator=(const RegistrationWatch &) = delete;

  private:
    void watch() {
        pthread_setname_np(pthread_self(), "sfuredis-regwait");
        auto started = Clock::now();
        auto next = started + REGISTRATION_QUIET;
        std::unique_lock<std::mutex> lock(mutex_);
        while (!cv_.wait_until(lock, next, [this] { return done_; })) {
            auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - started).count();
            log(LOG_WARN, "still registering with Redis after " + std::to_string(waited) +
                              " s: most likely a process with the same instance_id ended without "
                              "stopping (killed or crashed) and its heartbeat has not expired yet; "
                              "registration waits for it (at most the heartbeat TTL plus one "
                              "interval, 40 s at the default timings); events are queued meanwhile");
            next += REGISTRATION_LOG_EVERY;
        }
    }

    std::mutex mutex_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_; // last: starts once the members above exist
};

} // namespace

bool Bridge::start_node() {
    try {
        std::shared_ptr<sfu::Node> node;
        {
            RegistrationWatch watch;
            node = std::make_shared<sfu::Node>(settings_.config);
        }
        std::shared_ptr<Shared> shared = shared_;
        node->on_event([shared](const sfu::Event &e) { on_library_event(shared, e); });
        std::string id = node->instance_id();
        {
            std::lock_guard<std::mutex> lock(node_mutex_);
            node_ = node;
        }
        {
            std::lock_guard<std::mutex> lock(shared_->mutex);
            shared_->instance = id;
            shared_->connected = true;
        }
        node->ready();
        log(LOG_INFO, "registered as instance " + id + " (" + settings_.summary + ")");
        return true;
    } catch (const sfu::Error &e) {
        auto n = shared_->start_failures.fetch_add(1, std::memory_order_relaxed);
        shared_->note_error(e.what());
        if (n == 0 || n % RETRY_LOG_EVERY == 0) {
            log(LOG_WARN, std::string("cannot start yet (attempt ") + std::to_string(n + 1) + "): " + e.what() +
                              "; retrying, events are queued meanwhile");
        }
    } catch (const std::exception &e) {
        shared_->start_failures.fetch_add(1, std::memory_order_relaxed);
        shared_->note_error(e.what());
        log(LOG_ERR, std::string("cannot start: ") + e.what() + "; retrying");
    }
    return false;
}

void Bridge::run() noexcept {
    // Named for top -H and /proc/<pid>/task/*/comm (15 characters at most).
    pthread_setname_np(pthread_self(), "sfuredis-worker");
    unsigned start_attempt = 0;
    for (;;) {
        {
            std::lock_guard<std::mutex> lock(shared_->mutex);
            if (shared_->stopping) {
                return;
            }
        }
        if (!node()) {
            if (!start_node()) {
                if (!backoff(start_attempt++)) {
                    return;
                }
                continue;
            }
        }
        Job job;
        {
            std::unique_lock<std::mutex> lock(shared_->mutex);
            shared_->wake.wait(lock, [&] { return shared_->stopping || !shared_->queue.empty(); });
            if (shared_->stopping) {
                return;
            }
            job = std::move(shared_->queue.front());
            shared_->queue.pop_front();
            shared_->in_flight = true;
        }
        auto taken = Clock::now();
        shared_->queue_wait_us.fetch_add(micros(taken - job.queued), std::memory_order_relaxed);
        try {
            execute(job);
        } catch (...) {
            bump(shared_->failed);
            log(LOG_ERR, "unexpected failure on " + job.describe());
        }
        shared_->busy_us.fetch_add(micros(Clock::now() - taken), std::memory_order_relaxed);
        {
            std::lock_guard<std::mutex> lock(shared_->mutex);
            shared_->in_flight = false;
        }
        shared_->report_drops();
    }
}

void Bridge::execute(const Job &job) {
    for (unsigned attempt = 0;; ++attempt) {
        try {
            apply(job);
            if (job.kind != JobKind::ForgetRoom) {
                bump(shared_->handled);
            }
            if (attempt > 0) {
                log(LOG_INFO, "Redis answers again: " + job.describe() + " done after " + std::to_string(attempt) +
                                  " retr" + (attempt == 1 ? "y" : "ies"));
            }
            return;
        } catch (const sfu::Error &e) {
            shared_->note_error(e.what());
            if (e.status() == SFU_ERR_REDIS) {
                bump(shared_->redis_retries);
                if (attempt % RETRY_LOG_EVERY == 0) {
                    log(LOG_WARN, "Redis error on " + job.describe() + " (attempt " + std::to_string(attempt + 1) +
                                      "): " + e.message() + "; retrying, later events wait");
                }
                if (!backoff(attempt)) {
                    return;
                }
                continue;
            }
            if (e.status() == SFU_ERR_STOPPED) {
                return;
            }
            bump(shared_->failed);
            log(LOG_WARN, job.describe() + " not recorded: " + e.what());
            return;
        }
    }
}

bool Bridge::pin(const std::string &room, const char *why) {
    auto n = node();
    auto result = n->pin_room(room);
    if (result.owned()) {
        rooms_.insert(room);
        if (result.outcome == sfu::PinOutcome::TookOver) {
            log(LOG_INFO, "room " + room + " taken over from instance " + result.other + " (" + why + ")");
        } else {
            log(LOG_VERB, "room " + room + " pinned (" + why + ")");
        }
        return true;
    }
    rooms_.erase(room);
    bump(shared_->rooms_held);
    log(LOG_WARN, "room " + room + " (" + why + ") is held by instance " + result.other +
                      ": its participants on this Janus are not recorded; send its clients there");
    return false;
}

void Bridge::forget(const std::string &room) {
    rooms_.erase(room);
    auto it = peers_.find(room);
    if (it == peers_.end()) {
        return;
    }
    for (const auto &p : it->second) {
        handles_.erase(p.second.handle_id);
    }
    peers_.erase(it);
}

void Bridge::remove(const std::string &room, const std::string &peer, const char *why) {
    auto r = peers_.find(room);
    if (r == peers_.end() || r->second.find(peer) == r->second.end()) {
        log(LOG_VERB, "participant " + peer + " of room " + room + " " + why + ": not recorded here, nothing to remove");
        return;
    }
    auto state = r->second.at(peer);
    bool removed = false;
    try {
        removed = node()->remove_peer(room, peer, state.generation);
    } catch (const sfu::Error &e) {
        if (e.status() != SFU_ERR_NOT_OWNER) {
            throw;
        }
        log(LOG_INFO, "participant " + peer + " of room " + room + " " + why +
                          ": its record belongs to another instance now, left alone");
    }
    log(LOG_VERB, "participant " + peer + " of room " + room + " " + why +
                      (removed ? ": removed" : ": already gone (replaced or removed)"));
    handles_.erase(state.handle_id);
    r->second.erase(peer);
    if (r->second.empty()) {
        peers_.erase(r);
    }
}

void Bridge::apply(const Job &job) {
    switch (job.kind) {
    case JobKind::CreateRoom:
        pin(job.room, "created");
        return;
    case JobKind::DestroyRoom:
        try {
            node()->close_room(job.room);
            log(LOG_VERB, "room " + job.room + " closed (destroyed)");
        } catch (const sfu::Error &e) {
            if (e.status() != SFU_ERR_NOT_OWNER) {
                throw;
            }
            log(LOG_VERB, "room " + job.room + " destroyed: not this instance's, nothing to close");
        }
        forget(job.room);
        return;
    case JobKind::Join: {
        if (rooms_.count(job.room) == 0 && !pin(job.room, "first participant")) {
            bump(shared_->joins_not_recorded);
            return;
        }
        sfu::Node::Fields fields;
        if (job.display) {
            fields.emplace_back("display", *job.display);
        }
        sfu::Upserted up{};
        try {
            up = node()->upsert_peer_detailed(job.room, job.peer, job.guest, fields);
        } catch (const sfu::Error &e) {
            if (e.status() == SFU_ERR_NOT_OWNER) {
                // Lost between its pin and now: pinned again by the next participant.
                rooms_.erase(job.room);
            }
            throw;
        }
        auto &room = peers_[job.room];
        auto old = room.find(job.peer);
        if (old != room.end()) {
            handles_.erase(old->second.handle_id);
        }
        room[job.peer] = PeerState{up.generation, job.handle_id};
        if (job.handle_id != 0) {
            handles_[job.handle_id] = {job.room, job.peer};
        }
        if (up.replaced) {
            bump(shared_->replaced);
            log(LOG_INFO, "guest " + job.guest.value_or("?") + " rejoined room " + job.room + " as participant " +
                              job.peer + ": the record of participant " + *up.replaced + " was replaced");
            auto gone = room.find(*up.replaced);
            if (gone != room.end()) {
                handles_.erase(gone->second.handle_id);
                room.erase(gone);
            }
        }
        return;
    }
    case JobKind::Leave:
        remove(job.room, job.peer, job.reason.c_str());
        return;
    case JobKind::Detach: {
        auto h = handles_.find(job.handle_id);
        if (h == handles_.end()) {
            return;
        }
        auto where = h->second;
        remove(where.first, where.second, "detached");
        return;
    }
    case JobKind::ForgetRoom:
        forget(job.room);
        return;
    }
}

json_t *Bridge::where(const json_t *room) {
    auto id = id_of(room);
    if (!id) {
        return error_reply(413, "'room' must be a number or a string");
    }
    auto n = node();
    if (!n) {
        std::string why;
        {
            std::lock_guard<std::mutex> lock(shared_->mutex);
            why = shared_->last_error;
        }
        return error_reply(503, "not registered with Redis yet" + (why.empty() ? std::string() : ": " + why));
    }
    try {
        auto owner = n->room_owner(*id);
        json_t *out = json_object();
        json_object_set_new(out, "room", json_deep_copy(room));
        json_object_set_new(out, "owner", owner ? json_string(owner->c_str()) : json_null());
        return out;
    } catch (const sfu::Error &e) {
        return error_reply(e.status() == SFU_ERR_INVALID_ID ? 413 : 500, e.what());
    }
}

json_t *Bridge::stats() {
    json_t *out = json_object();
    json_t *queue = json_object();
    json_t *counters = json_object();
    {
        std::lock_guard<std::mutex> lock(shared_->mutex);
        json_object_set_new(out, "instance",
                            shared_->instance.empty() ? json_null() : json_string(shared_->instance.c_str()));
        json_object_set_new(out, "registered", json_boolean(shared_->connected));
        json_object_set_new(queue, "depth", u64(shared_->queue.size() + (shared_->in_flight ? 1 : 0)));
        json_object_set_new(queue, "capacity", u64(shared_->capacity));
        json_object_set_new(queue, "max_depth", u64(shared_->max_depth));
        json_object_set_new(out, "last_error",
                            shared_->last_error.empty() ? json_null() : json_string(shared_->last_error.c_str()));
    }
    json_object_set_new(queue, "dropped", u64(get(shared_->dropped)));
    json_object_set_new(out, "queue", queue);
    json_object_set_new(counters, "received", u64(get(shared_->received)));
    json_object_set_new(counters, "handled", u64(get(shared_->handled)));
    json_object_set_new(counters, "dropped", u64(get(shared_->dropped)));
    json_object_set_new(counters, "bad_events", u64(get(shared_->bad_events)));
    json_object_set_new(counters, "failed", u64(get(shared_->failed)));
    json_object_set_new(counters, "redis_retries", u64(get(shared_->redis_retries)));
    json_object_set_new(counters, "rooms_held", u64(get(shared_->rooms_held)));
    json_object_set_new(counters, "joins_not_recorded", u64(get(shared_->joins_not_recorded)));
    json_object_set_new(counters, "replaced", u64(get(shared_->replaced)));
    json_object_set_new(counters, "start_failures", u64(get(shared_->start_failures)));
    json_object_set_new(counters, "busy_us", u64(get(shared_->busy_us)));
    json_object_set_new(counters, "queue_wait_us", u64(get(shared_->queue_wait_us)));
    json_object_set_new(out, "counters", counters);
    auto n = node();
    if (!n) {
        json_object_set_new(out, "node", json_null());
        return out;
    }
    try {
        auto s = n->stats();
        json_t *node = json_object();
        json_object_set_new(node, "instance_id", json_string(s.instance_id.c_str()));
        json_object_set_new(node, "redis", json_boolean(s.redis));
        json_object_set_new(node, "is_leader", json_boolean(s.is_leader));
        json_object_set_new(node, "epoch", u64(s.epoch));
        json_object_set_new(node, "rooms", u64(s.rooms));
        json_object_set_new(node, "peers", u64(s.peers));
        json_object_set_new(node, "heartbeats", u64(s.heartbeats));
        json_object_set_new(node, "heartbeat_failures", u64(s.heartbeat_failures));
        json_object_set_new(node, "last_heartbeat_age_ms", json_integer(s.last_heartbeat_age_ms));
        json_object_set_new(node, "redis_errors", u64(s.redis_errors));
        json_object_set_new(node, "bad_data", u64(s.bad_data));
        json_object_set_new(node, "last_error", s.last_error ? json_string(s.last_error->c_str()) : json_null());
        json_object_set_new(node, "instances_reaped", u64(s.instances_reaped));
        json_object_set_new(node, "rooms_reaped", u64(s.rooms_reaped));
        json_object_set_new(node, "peers_reaped", u64(s.peers_reaped));
        json_object_set_new(node, "events_dropped", u64(s.events_dropped));
        json_object_set_new(out, "node", node);
    } catch (const sfu::Error &e) {
        json_object_set_new(out, "node", error_reply(500, e.what()));
    }
    return out;
}

void Bridge::shutdown() noexcept {
    std::call_once(shutdown_once_, [this] {
        std::size_t discarded = 0;
        {
            std::lock_guard<std::mutex> lock(shared_->mutex);
            shared_->stopping = true;
            discarded = shared_->queue.size();
            shared_->queue.clear();
            shared_->connected = false;
        }
        shared_->discarded_at_stop.fetch_add(discarded, std::memory_order_relaxed);
        shared_->wake.notify_all();
        if (worker_.joinable()) {
            worker_.join();
        }
        if (discarded > 0) {
            log(LOG_INFO, std::to_string(discarded) + " queued event(s) discarded at shutdown (the leave removes everything)");
        }
        std::shared_ptr<sfu::Node> n;
        {
            std::lock_guard<std::mutex> lock(node_mutex_);
            n = std::move(node_);
        }
        if (!n) {
            return;
        }
        try {
            n->leave();
            log(LOG_INFO, "left: every room and participant of this instance removed from Redis");
        } catch (const std::exception &e) {
            log(LOG_WARN, std::string("leave failed: ") + e.what() +
                              " (another instance's reaper removes what is left once this one is seen dead)");
        }
    });
}

} // namespace sfuredis

// The bridge between Janus's threads and Redis: a bounded queue that Janus's events thread
// fills without ever waiting on Redis, and one worker thread of the handler's own that owns
// the sfu-redis node and applies the jobs in order (one queue, one worker: Janus's order,
// so per-room order, is kept). A Redis outage holds the job at the head of the queue and
// retries it with backoff; the queue then fills, and what does not fit is dropped, counted
// and logged. Janus is never held up.
#ifndef SFUREDIS_BRIDGE_HPP
#define SFUREDIS_BRIDGE_HPP

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "events.hpp"
#include "janus_api.hpp"
#include "settings.hpp"
#include "sfu_redis.hpp"

namespace sfuredis {

/// The queue and the counters, shared with the library's event callback (which may outlive
/// the Bridge by a few events while the node shuts down).
struct Shared;

class Bridge {
public:
    /// Starts the worker thread, which starts the node (retrying while Redis is unreachable).
    /// Throws std::system_error if the thread cannot be started.
    explicit Bridge(Settings settings);
    ~Bridge();
    Bridge(const Bridge &) = delete;
    Bridge &operator=(const Bridge &) = delete;

    /// Janus's events thread: queues `job`, or drops it when the queue is full (counted and
    /// logged). Takes a short lock; never waits on Redis.
    void submit(Job job) noexcept;
    /// Janus's events thread: an event of an unexpected shape (counted and logged).
    void reject(const std::string &why) noexcept;

    /// Admin API {"request":"where","room":R}: {"room":R,"owner":"<instance>"|null}. One
    /// Redis read on the caller's thread (Janus's Admin API request thread).
    json_t *where(const json_t *room);
    /// Admin API {"request":"stats"}: the queue, the counters and the node's stats.
    json_t *stats();

    /// Stops the worker (queued jobs are discarded: leave removes everything anyway), then
    /// leaves the cluster: every room and participant of this instance is removed from Redis
    /// and its registration deleted. Idempotent.
    void shutdown() noexcept;

private:
    struct PeerState {
        std::uint64_t generation = 0;
        std::uint64_t handle_id = 0;
    };

    void run() noexcept;
    bool start_node();
    void execute(const Job &job);
    void apply(const Job &job);
    bool pin(const std::string &room, const char *why);
    void remove(const std::string &room, const std::string &peer, const char *why);
    void forget(const std::string &room);
    /// Waits the backoff of `attempt` (100 ms doubling to 5 s, jittered); false when stopping.
    bool backoff(unsigned attempt);
    std::shared_ptr<sfu::Node> node() const;

    Settings settings_;
    std::shared_ptr<Shared> shared_;
    mutable std::mutex node_mutex_;
    std::shared_ptr<sfu::Node> node_;
    std::thread worker_;
    std::once_flag shutdown_once_;

    // The worker thread's own state: what this instance holds, as far as it knows.
    std::unordered_set<std::string> rooms_;
    std::map<std::string, std::map<std::string, PeerState>> peers_;
    std::unordered_map<std::uint64_t, std::pair<std::string, std::string>> handles_;
};

} // namespace sfuredis

#endif // SFUREDIS_BRIDGE_HPP

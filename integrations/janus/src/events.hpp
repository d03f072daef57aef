// From a Janus event (the JSON object incoming_event receives) to a job for the worker: the
// VideoRoom events that change what Redis must hold, and the handle detach. Pure: no Redis,
// no locks, cheap enough for Janus's events thread.
//
// Shapes relied on (Janus 1.1.x, src/events.c and plugins/janus_videoroom.c):
//   plugin event (type 64): {"type":64, "session_id":S?, "handle_id":H?, "opaque_id":O?,
//       "event":{"plugin":"janus.plugin.videoroom", "data":{"event":NAME, "room":R, ...}}}
//     NAME "created" / "destroyed": room R;
//     NAME "joined": room R, "id":P (the publisher), "display":D?; sent with the joining
//       handle, so H and O (the handle's opaque_id, when the client gave one) are set;
//     NAME "leaving" / "kicked": room R, "id":P; sent without a handle (no H, no O).
//   handle event (type 2): {"type":2, "session_id":S, "handle_id":H, "opaque_id":O?,
//       "event":{"name":"detached", "plugin":"janus.plugin.videoroom", ...}}
// R and P are JSON numbers, or strings when VideoRoom runs with string_ids = true.
#ifndef SFUREDIS_EVENTS_HPP
#define SFUREDIS_EVENTS_HPP

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "janus_api.hpp"

namespace sfuredis {

inline constexpr const char *VIDEOROOM = "janus.plugin.videoroom";

/// What the worker does with one job.
enum class JobKind {
    /// A room was created: pin it.
    CreateRoom,
    /// A room was destroyed: close it (its peers go with it).
    DestroyRoom,
    /// A publisher joined: pin the room if this instance does not hold it yet, upsert the peer.
    Join,
    /// A publisher left or was kicked: remove the peer with the generation its upsert returned.
    Leave,
    /// A VideoRoom handle was detached: remove the peer it joined as, if any.
    Detach,
    /// Internal: the library says a room is no longer this instance's (room_lost, reaped_self):
    /// forget what the worker knows of it.
    ForgetRoom,
};

const char *job_name(JobKind kind) noexcept;

struct Job {
    JobKind kind = JobKind::CreateRoom;
    std::string room;
    std::string peer;
    std::optional<std::string> guest;
    std::optional<std::string> display;
    std::uint64_t handle_id = 0;
    /// "leaving" or "kicked" (Leave), for the log.
    std::string reason;
    std::chrono::steady_clock::time_point queued{};

    /// "joined room=R peer=P" and so on, for the log.
    std::string describe() const;
};

/// The outcome of reading one event.
struct Mapped {
    enum class Kind { Ignored, Bad, Work } kind = Kind::Ignored;
    /// Bad: why (the field and what was wrong).
    std::string why;
    Job job;
};

/// Maps one Janus event; never throws std::exception of its own (std::bad_alloc aside).
Mapped map_event(const json_t *event);

/// A VideoRoom id as the library's id: a number as its decimal form, a string as it is;
/// std::nullopt for anything else.
std::optional<std::string> id_of(const json_t *value);

} // namespace sfuredis

#endif // SFUREDIS_EVENTS_HPP

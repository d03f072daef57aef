// Janus events to jobs (see events.hpp for the shapes).
#include "events.hpp"

#include <cstring>

namespace sfuredis {

namespace {

Mapped bad(std::string why) {
    Mapped m;
    m.kind = Mapped::Kind::Bad;
    m.why = std::move(why);
    return m;
}

Mapped work(Job job) {
    Mapped m;
    m.kind = Mapped::Kind::Work;
    m.job = std::move(job);
    return m;
}

/// Janus's event type numbers (events/eventhandler.h).
constexpr json_int_t TYPE_HANDLE = JANUS_EVENT_TYPE_HANDLE;
constexpr json_int_t TYPE_PLUGIN = JANUS_EVENT_TYPE_PLUGIN;

std::optional<std::string> string_of(const json_t *v) {
    if (v == nullptr || !json_is_string(v)) {
        return std::nullopt;
    }
    return std::string(json_string_value(v), json_string_length(v));
}

std::uint64_t handle_of(const json_t *event) {
    const json_t *h = json_object_get(event, "handle_id");
    if (h == nullptr || !json_is_integer(h) || json_integer_value(h) <= 0) {
        return 0;
    }
    return static_cast<std::uint64_t>(json_integer_value(h));
}

Mapped map_videoroom(const json_t *event, const json_t *data, const std::string &name) {
    Job job;
    job.queued = std::chrono::steady_clock::now();
    auto room = id_of(json_object_get(data, "room"));
    if (!room) {
        return bad("VideoRoom '" + name + "' event without a room id (a number or a string)");
    }
    job.room = *room;
    if (name == "created") {
        job.kind = JobKind::CreateRoom;
        return work(std::move(job));
    }
    if (name == "destroyed") {
        job.kind = JobKind::DestroyRoom;
        return work(std::move(job));
    }
    auto peer = id_of(json_object_get(data, "id"));
    if (!peer) {
        return bad("VideoRoom '" + name + "' event of room " + job.room +
                   " without a participant id (a number or a string)");
    }
    job.peer = *peer;
    if (name == "joined") {
        job.kind = JobKind::Join;
        job.handle_id = handle_of(event);
        auto opaque = string_of(json_object_get(event, "opaque_id"));
        if (opaque && !opaque->empty()) {
            job.guest = std::move(opaque);
        }
        job.display = string_of(json_object_get(data, "display"));
        return work(std::move(job));
    }
    // "leaving" or "kicked"
    job.kind = JobKind::Leave;
    job.reason = name;
    return work(std::move(job));
}

} // namespace

const char *job_name(JobKind kind) noexcept {
    switch (kind) {
    case JobKind::CreateRoom: return "created";
    case JobKind::DestroyRoom: return "destroyed";
    case JobKind::Join: return "joined";
    case JobKind::Leave: return "left";
    case JobKind::Detach: return "detached";
    case JobKind::ForgetRoom: return "forget";
    }
    return "?";
}

std::string Job::describe() const {
    std::string out = kind == JobKind::Leave ? reason : job_name(kind);
    if (!room.empty()) {
        out += " room=" + room;
    }
    if (!peer.empty()) {
        out += " participant=" + peer;
    }
    if (handle_id != 0) {
        out += " handle=" + std::to_string(handle_id);
    }
    return out;
}

std::optional<std::string> id_of(const json_t *value) {
    if (value == nullptr) {
        return std::nullopt;
    }
    if (json_is_integer(value)) {
        return std::to_string(json_integer_value(value));
    }
    return string_of(value);
}

Mapped map_event(const json_t *event) {
    if (event == nullptr || !json_is_object(event)) {
        return bad("an event that is not a JSON object");
    }
    const json_t *type = json_object_get(event, "type");
    if (type == nullptr || !json_is_integer(type)) {
        return bad("an event without a numeric type");
    }
    const json_t *body = json_object_get(event, "event");
    json_int_t t = json_integer_value(type);
    if (t != TYPE_PLUGIN && t != TYPE_HANDLE) {
        return Mapped{};
    }
    if (body == nullptr || !json_is_object(body)) {
        return bad("a " + std::string(t == TYPE_PLUGIN ? "plugin" : "handle") + " event without an 'event' object");
    }
    auto plugin = string_of(json_object_get(body, "plugin"));
    if (!plugin || *plugin != VIDEOROOM) {
        return Mapped{};
    }
    if (t == TYPE_HANDLE) {
        auto name = string_of(json_object_get(body, "name"));
        if (!name || *name != "detached") {
            return Mapped{};
        }
        Job job;
        job.kind = JobKind::Detach;
        job.handle_id = handle_of(event);
        job.queued = std::chrono::steady_clock::now();
        if (job.handle_id == 0) {
            return bad("a VideoRoom 'detached' event without a handle_id");
        }
        return work(std::move(job));
    }
    const json_t *data = json_object_get(body, "data");
    if (data == nullptr || !json_is_object(data)) {
        return bad("a VideoRoom event without a 'data' object");
    }
    // Only events that carry "event" matter; "talking", "moderated" and the like carry
    // "videoroom" instead.
    auto name = string_of(json_object_get(data, "event"));
    if (!name) {
        return Mapped{};
    }
    if (*name == "created" || *name == "destroyed" || *name == "joined" || *name == "leaving" ||
        *name == "kicked") {
        return map_videoroom(event, data, *name);
    }
    return Mapped{};
}

} // namespace sfuredis

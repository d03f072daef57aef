// janus.eventhandler.sfuredis: a Janus event handler keeping VideoRoom's rooms and
// participants in sfu-redis. The entry points Janus calls (events/eventhandler.h, API version
// 3): create() returns the handler; init() reads the configuration and starts the bridge;
// incoming_event() maps an event and queues it; handle_request() answers the Admin API's
// query_eventhandler; destroy() leaves the cluster. No exception crosses into Janus.
//
// Janus 1.1 calls init() and ignores what it returns: a handler whose init failed (disabled,
// a bad configuration) stays loaded. Its events mask stays empty, so Janus sends it no event,
// and its handle_request answers with the reason.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "bridge.hpp"
#include "events.hpp"
#include "janus_api.hpp"
#include "log.hpp"
#include "settings.hpp"

namespace {

constexpr int VERSION = 1;
constexpr const char *VERSION_STRING = "0.1.0";
constexpr const char *DESCRIPTION =
    "Keeps VideoRoom's rooms and participants in sfu-redis (heartbeats, one reaper leader, "
    "clean-up of dead instances) so several Janus instances share one Redis.";
constexpr const char *NAME = "JANUS sfu-redis event handler";
constexpr const char *AUTHOR = "sfu-redis";

std::mutex lifecycle;
std::atomic<sfuredis::Bridge *> bridge{nullptr};
/// Why the handler is not running, for handle_request (guarded by `lifecycle`).
std::string not_running = "not initialised";

int sfuredis_init(const char *config_path);
void sfuredis_destroy(void);
int sfuredis_get_api_compatibility(void) { return JANUS_EVENTHANDLER_API_VERSION; }
int sfuredis_get_version(void) { return VERSION; }
const char *sfuredis_get_version_string(void) { return VERSION_STRING; }
const char *sfuredis_get_description(void) { return DESCRIPTION; }
const char *sfuredis_get_name(void) { return NAME; }
const char *sfuredis_get_author(void) { return AUTHOR; }
const char *sfuredis_get_package(void) { return sfuredis::PACKAGE; }
void sfuredis_incoming_event(json_t *event);
json_t *sfuredis_handle_request(json_t *request);

// Janus's struct has const function pointers and C designated initializers in its init
// macro; C++17 initializes it in member order instead.
janus_eventhandler handler = {
    sfuredis_init,
    sfuredis_destroy,
    sfuredis_get_api_compatibility,
    sfuredis_get_version,
    sfuredis_get_version_string,
    sfuredis_get_description,
    sfuredis_get_name,
    sfuredis_get_author,
    sfuredis_get_package,
    sfuredis_incoming_event,
    sfuredis_handle_request,
    JANUS_EVENT_TYPE_NONE,
};

int sfuredis_init(const char *config_path) {
    try {
        std::lock_guard<std::mutex> lock(lifecycle);
        if (bridge.load() != nullptr) {
            sfuredis::log(LOG_WARN, "init called twice; ignored");
            return -1;
        }
        if (config_path == nullptr) {
            not_running = "Janus passed no configuration folder";
            sfuredis::log(LOG_ERR, not_running);
            return -1;
        }
        std::string error;
        auto settings = sfuredis::load_settings(config_path, error);
        if (!settings) {
            not_running = "disabled by a configuration error: " + error;
            sfuredis::log(LOG_ERR, not_running);
            return -1;
        }
        if (!settings->enabled) {
            not_running = std::string("disabled (enabled = true is not set in ") + config_path + "/" +
                          sfuredis::PACKAGE + ".jcfg)";
            sfuredis::log(LOG_WARN, not_running);
            return -1;
        }
        sfuredis::log(LOG_INFO, "starting, sfu-redis " + sfu::version() + ": " + settings->summary);
        auto b = std::make_unique<sfuredis::Bridge>(std::move(*settings));
        bridge.store(b.release());
        handler.events_mask = JANUS_EVENT_TYPE_PLUGIN | JANUS_EVENT_TYPE_HANDLE;
        not_running.clear();
        sfuredis::log(LOG_INFO, std::string(NAME) + " initialized");
        return 0;
    } catch (const std::exception &e) {
        sfuredis::log(LOG_ERR, std::string("init failed: ") + e.what());
    } catch (...) {
        sfuredis::log(LOG_ERR, "init failed");
    }
    return -1;
}

void sfuredis_destroy(void) {
    try {
        std::lock_guard<std::mutex> lock(lifecycle);
        handler.events_mask = JANUS_EVENT_TYPE_NONE;
        // Janus stops its events thread and its transports before it destroys handlers, so
        // neither incoming_event nor handle_request can still be using the bridge.
        sfuredis::Bridge *b = bridge.exchange(nullptr);
        if (b == nullptr) {
            return;
        }
        b->shutdown();
        delete b;
        not_running = "destroyed";
        sfuredis::log(LOG_INFO, std::string(NAME) + " destroyed");
    } catch (...) {
        // Nothing may unwind into Janus.
    }
}

void sfuredis_incoming_event(json_t *event) {
    // Janus keeps its own reference to `event` and drops it after this call (events.c in 1.1):
    // the handler reads what it needs now and keeps no reference.
    try {
        sfuredis::Bridge *b = bridge.load();
        if (b == nullptr) {
            return;
        }
        auto mapped = sfuredis::map_event(event);
        switch (mapped.kind) {
        case sfuredis::Mapped::Kind::Ignored:
            return;
        case sfuredis::Mapped::Kind::Bad:
            b->reject(mapped.why);
            return;
        case sfuredis::Mapped::Kind::Work:
            b->submit(std::move(mapped.job));
            return;
        }
    } catch (...) {
        // An event lost to an allocation failure; Janus goes on.
    }
}

json_t *reply_error(int code, const std::string &message) {
    json_t *out = json_object();
    json_object_set_new(out, "error_code", json_integer(code));
    json_object_set_new(out, "error", json_string(message.c_str()));
    return out;
}

json_t *sfuredis_handle_request(json_t *request) {
    try {
        sfuredis::Bridge *b = bridge.load();
        if (b == nullptr) {
            std::lock_guard<std::mutex> lock(lifecycle);
            return reply_error(503, "the sfu-redis handler is not running: " + not_running);
        }
        const json_t *what = request ? json_object_get(request, "request") : nullptr;
        if (what == nullptr || !json_is_string(what)) {
            return reply_error(412, "missing 'request' (\"where\" or \"stats\")");
        }
        std::string name = json_string_value(what);
        if (name == "where") {
            const json_t *room = json_object_get(request, "room");
            if (room == nullptr) {
                return reply_error(412, "missing 'room'");
            }
            return b->where(room);
        }
        if (name == "stats") {
            return b->stats();
        }
        return reply_error(411, "unknown request '" + name + "' (\"where\" or \"stats\")");
    } catch (const std::exception &e) {
        return reply_error(500, e.what());
    } catch (...) {
        return reply_error(500, "internal error");
    }
}

} // namespace

/// The hook Janus looks up with dlsym.
extern "C" __attribute__((visibility("default"))) janus_eventhandler *create(void) {
    return &handler;
}

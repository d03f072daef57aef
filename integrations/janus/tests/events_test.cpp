// The event mapping (src/events.cpp) on the shapes Janus sends and on shapes it should not:
// every VideoRoom event that matters becomes the right job with the right ids, everything
// else is ignored, and a malformed event is reported as bad with a reason, never a crash.
// Built with the handler (CMake target sfuredis_events_test) and run by capi/tests/janus.rs;
// exits 0 when every check passes, 1 otherwise (each failure printed).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../src/events.hpp"

namespace {

int failures = 0;
int checks = 0;

void check(bool ok, const std::string &what) {
    ++checks;
    if (!ok) {
        ++failures;
        std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    }
}

/// Maps the event written as JSON text (the parsed object is released afterwards).
sfuredis::Mapped map(const char *text) {
    json_error_t error;
    json_t *event = json_loads(text, JSON_DECODE_ANY, &error);
    if (event == nullptr) {
        std::fprintf(stderr, "bad test JSON %s: %s\n", text, error.text);
        std::exit(2);
    }
    sfuredis::Mapped m = sfuredis::map_event(event);
    json_decref(event);
    return m;
}

void work(const char *text, sfuredis::JobKind kind, const std::string &room, const std::string &peer) {
    auto m = map(text);
    check(m.kind == sfuredis::Mapped::Kind::Work, std::string("work: ") + text + " (" + m.why + ")");
    check(m.job.kind == kind, std::string("kind: ") + text + " -> " + sfuredis::job_name(m.job.kind));
    check(m.job.room == room, std::string("room: ") + text + " -> " + m.job.room);
    check(m.job.peer == peer, std::string("participant: ") + text + " -> " + m.job.peer);
}

void ignored(const char *text) {
    auto m = map(text);
    check(m.kind == sfuredis::Mapped::Kind::Ignored, std::string("ignored: ") + text + " (" + m.why + ")");
}

void bad(const char *text, const std::string &reason) {
    auto m = map(text);
    check(m.kind == sfuredis::Mapped::Kind::Bad, std::string("bad: ") + text);
    check(m.why.find(reason) != std::string::npos, std::string("reason of ") + text + ": '" + m.why + "'");
}

} // namespace

int main() {
    using sfuredis::JobKind;
    // The shapes of Janus 1.1 (events.c, janus_videoroom.c).
    work(R"({"type":64,"session_id":1,"handle_id":2,"event":{"plugin":"janus.plugin.videoroom",
             "data":{"event":"created","room":1234}}})",
         JobKind::CreateRoom, "1234", "");
    work(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"destroyed","room":"lobby"}}})",
         JobKind::DestroyRoom, "lobby", "");
    work(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"leaving","room":7,"id":42}}})",
         JobKind::Leave, "7", "42");
    work(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"kicked","room":"r","id":"p"}}})",
         JobKind::Leave, "r", "p");
    work(R"({"type":2,"session_id":1,"handle_id":99,"event":{"name":"detached","plugin":"janus.plugin.videoroom"}})",
         JobKind::Detach, "", "");
    {
        auto m = map(R"({"type":64,"session_id":1,"handle_id":5,"opaque_id":"guest-1",
                         "event":{"plugin":"janus.plugin.videoroom","data":{"event":"joined","room":1234,
                         "id":8858191837617343,"private_id":3,"display":"Zoë"}}})");
        check(m.kind == sfuredis::Mapped::Kind::Work && m.job.kind == JobKind::Join, "joined is a Join");
        check(m.job.room == "1234" && m.job.peer == "8858191837617343", "joined ids: " + m.job.describe());
        check(m.job.guest && *m.job.guest == "guest-1", "joined guest from the event's opaque_id");
        check(m.job.display && *m.job.display == "Zoë", "joined display");
        check(m.job.handle_id == 5, "joined handle");
        auto n = map(R"({"type":64,"handle_id":5,"opaque_id":"","event":{"plugin":"janus.plugin.videoroom",
                         "data":{"event":"joined","room":"r","id":"p"}}})");
        check(n.kind == sfuredis::Mapped::Kind::Work && !n.job.guest && !n.job.display,
              "an empty opaque_id and no display: no guest, no display field");
    }
    // Ids: numbers as their decimal form, strings as they are (even odd ones: the library
    // judges them).
    work(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"created","room":-5}}})",
         JobKind::CreateRoom, "-5", "");
    work(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"created","room":""}}})",
         JobKind::CreateRoom, "", "");
    work(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"created","room":"a:b/c {d}"}}})",
         JobKind::CreateRoom, "a:b/c {d}", "");
    // Ignored: other types, plugins, VideoRoom events that change nothing, other handle events.
    ignored(R"({"type":1,"session_id":1,"event":{"name":"created"}})");
    ignored(R"({"type":256,"event":{"status":"started"}})");
    ignored(R"({"type":64,"event":{"plugin":"janus.plugin.echotest","data":{"event":"created","room":1}}})");
    ignored(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"published","room":1,"id":2}}})");
    ignored(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"videoroom":"talking","room":1,"id":2}}})");
    ignored(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"subscribing","room":1}}})");
    ignored(R"({"type":2,"handle_id":3,"event":{"name":"attached","plugin":"janus.plugin.videoroom"}})");
    ignored(R"({"type":2,"handle_id":3,"event":{"name":"detached","plugin":"janus.plugin.echotest"}})");
    // Bad shapes: a reason each.
    bad(R"([1,2])", "not a JSON object");
    bad(R"({"event":{}})", "numeric type");
    bad(R"({"type":"64"})", "numeric type");
    bad(R"({"type":64})", "without an 'event' object");
    bad(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom"}})", "without a 'data' object");
    bad(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":"x"}})", "without a 'data' object");
    bad(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"created"}}})", "without a room id");
    bad(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"created","room":1.5}}})",
        "without a room id");
    bad(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"joined","room":true,"id":1}}})",
        "without a room id");
    bad(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"joined","room":1}}})",
        "without a participant id");
    bad(R"({"type":64,"event":{"plugin":"janus.plugin.videoroom","data":{"event":"leaving","room":1,"id":null}}})",
        "without a participant id");
    bad(R"({"type":2,"event":{"name":"detached","plugin":"janus.plugin.videoroom"}})", "without a handle_id");

    std::printf("events_test: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}

// Janus's log as the handler writes it: the level check, timestamps, colours and global prefix
// follow Janus's own settings (the variables the janus binary exports to its modules).
#include "log.hpp"

#include <ctime>

#include "janus_api.hpp"

namespace sfuredis {

namespace {

const char *level_tag(int level) noexcept {
    // Janus's debug.h keeps a coloured and a plain tag per level; warnings and errors are tagged.
    bool colours = janus_log_colors != FALSE;
    switch (level) {
    case LOG_FATAL: return colours ? "\x1b[35m[FATAL]\x1b[0m " : "[FATAL] ";
    case LOG_ERR: return colours ? "\x1b[31m[ERR]\x1b[0m " : "[ERR] ";
    case LOG_WARN: return colours ? "\x1b[33m[WARN]\x1b[0m " : "[WARN] ";
    default: return "";
    }
}

} // namespace

bool log_enabled(int level) noexcept {
    return level > LOG_NONE && level <= LOG_MAX && level <= janus_log_level;
}

void log(int level, const std::string &message) noexcept {
    if (!log_enabled(level)) {
        return;
    }
    char stamp[64] = "";
    if (janus_log_timestamps) {
        std::time_t now = std::time(nullptr);
        struct tm local {};
        localtime_r(&now, &local);
        std::strftime(stamp, sizeof(stamp), "[%a %b %e %T %Y] ", &local);
    }
    janus_vprintf("%s%s%s[sfuredis] %s\n", janus_log_global_prefix ? janus_log_global_prefix : "", stamp,
                  level_tag(level), message.c_str());
}

} // namespace sfuredis

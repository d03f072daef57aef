// The handler's configuration: janus.eventhandler.sfuredis.jcfg in the folder Janus passes to
// init, read with Janus's own parser (janus_config_parse). Its `general` section takes
// `enabled`, `queue_capacity` and every key of the C API's sfu_config_set, under the same name
// and with the same values; the library validates those (an unknown key is refused naming it).
#ifndef SFUREDIS_SETTINGS_HPP
#define SFUREDIS_SETTINGS_HPP

#include <cstddef>
#include <optional>
#include <string>

#include "sfu_redis.hpp"

namespace sfuredis {

/// The package name: also the configuration file's name (plus ".jcfg") and the handler name
/// of the Admin API's query_eventhandler.
inline constexpr const char *PACKAGE = "janus.eventhandler.sfuredis";

/// The queue's capacity when `queue_capacity` is not set.
inline constexpr std::size_t DEFAULT_QUEUE_CAPACITY = 10000;
/// The largest `queue_capacity` accepted.
inline constexpr std::size_t MAX_QUEUE_CAPACITY = 1000000;

struct Settings {
    /// `enabled`: false unless the file says true (Janus's convention).
    bool enabled = false;
    /// `queue_capacity`: events waiting for Redis at most (1 to MAX_QUEUE_CAPACITY).
    std::size_t queue_capacity = DEFAULT_QUEUE_CAPACITY;
    /// Every C API key of the file, set and validated.
    sfu::Config config;
    /// One line for the log: where (Redis URL without its credentials), prefix, instance id
    /// (or "default"), timings, the TLS / Sentinel keys set (names only). No secret.
    std::string summary;
};

/// Reads `<folder>/janus.eventhandler.sfuredis.jcfg`. Returns the settings, or std::nullopt
/// with `error` set to a sentence for the log (the file missing, an unknown key or section,
/// a value the library refuses: the key is named, no value is quoted).
std::optional<Settings> load_settings(const std::string &folder, std::string &error);

/// `url` with its user and password (everything between "://" and the last '@') replaced by
/// "***": what a log may show of a Redis URL.
std::string redact_url(const std::string &url);

} // namespace sfuredis

#endif // SFUREDIS_SETTINGS_HPP

// Lines in Janus's own log (its stdout and log file), at Janus's levels (LOG_ERR, LOG_WARN,
// LOG_INFO, LOG_VERB, ...), each prefixed "[sfuredis] ". Safe from any thread: Janus's log
// takes lines from every thread of the process.
#ifndef SFUREDIS_LOG_HPP
#define SFUREDIS_LOG_HPP

#include <string>

namespace sfuredis {

/// Writes `message` (one line, no newline) when Janus's debug_level is `level` or more.
void log(int level, const std::string &message) noexcept;

/// Whether a line at `level` would be written (to skip building it).
bool log_enabled(int level) noexcept;

} // namespace sfuredis

#endif // SFUREDIS_LOG_HPP

// Reading janus.eventhandler.sfuredis.jcfg (see settings.hpp).
#include "settings.hpp"

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <vector>

#include "janus_api.hpp"

namespace sfuredis {

namespace {

/// The handler's own keys; every other key of `general` goes to sfu_config_set.
constexpr const char *OWN_KEYS = "enabled, queue_capacity";

struct ConfigCloser {
    void operator()(janus_config *c) const noexcept { janus_config_destroy(c); }
};

/// Keys whose values the summary may show as they are.
bool shown(const std::string &key) {
    return key == "namespace" || key == "stage" || key == "branch" || key == "instance_id" || key == "timings";
}

/// Keys the summary names without their value.
bool named_only(const std::string &key) {
    return key.rfind("tls_", 0) == 0 || key.rfind("sentinel_", 0) == 0;
}

} // namespace

std::string redact_url(const std::string &url) {
    if (url.empty()) {
        return "(none: memory-only mode)";
    }
    auto scheme_end = url.find("://");
    if (scheme_end == std::string::npos) {
        return "(not a URL)";
    }
    auto authority = scheme_end + 3;
    auto at = url.rfind('@');
    if (at == std::string::npos || at < authority) {
        return url;
    }
    return url.substr(0, authority) + "***" + url.substr(at);
}

std::optional<Settings> load_settings(const std::string &folder, std::string &error) {
    std::string file = folder + "/" + PACKAGE + ".jcfg";
    std::unique_ptr<janus_config, ConfigCloser> parsed(janus_config_parse(file.c_str()));
    if (!parsed) {
        error = "cannot read " + file + " (missing or not a valid .jcfg file)";
        return std::nullopt;
    }
    janus_config *config = parsed.get();

    // Anything outside `general` is a mistake worth naming (a misspelt section would
    // otherwise hide its keys).
    GList *roots = janus_config_get_items(config, nullptr);
    bool stray_item = roots != nullptr;
    std::string stray_name = roots ? static_cast<janus_config_item *>(roots->data)->name : "";
    g_list_free(roots);
    if (stray_item) {
        error = file + ": '" + stray_name + "' is outside the general section";
        return std::nullopt;
    }
    GList *sections = janus_config_get_categories(config, nullptr);
    std::string stray_section;
    for (GList *s = sections; s != nullptr; s = s->next) {
        auto *c = static_cast<janus_config_category *>(s->data);
        if (c->name == nullptr || std::string(c->name) != "general") {
            stray_section = c->name ? c->name : "(unnamed)";
            break;
        }
    }
    g_list_free(sections);
    if (!stray_section.empty()) {
        error = file + ": unknown section '" + stray_section + "' (only 'general' is read)";
        return std::nullopt;
    }

    janus_config_category *general =
        janus_config_get(config, nullptr, janus_config_type_category, "general");
    Settings out;
    std::string url;
    std::vector<std::string> shown_parts;
    std::vector<std::string> named;
    GList *items = general ? janus_config_get_items(config, general) : nullptr;
    try {
        for (GList *i = items; i != nullptr; i = i->next) {
            auto *item = static_cast<janus_config_item *>(i->data);
            if (item->name == nullptr) {
                continue;
            }
            std::string key = item->name;
            std::string value = item->value ? item->value : "";
            if (key == "enabled") {
                out.enabled = janus_is_true(value.c_str()) != FALSE;
                continue;
            }
            if (key == "queue_capacity") {
                errno = 0;
                char *end = nullptr;
                unsigned long long n = std::strtoull(value.c_str(), &end, 10);
                if (value.empty() || *end != '\0' || errno != 0 || n == 0 || n > MAX_QUEUE_CAPACITY ||
                    value[0] == '-') {
                    error = file + ": queue_capacity must be a whole number from 1 to " +
                            std::to_string(MAX_QUEUE_CAPACITY);
                    g_list_free(items);
                    return std::nullopt;
                }
                out.queue_capacity = static_cast<std::size_t>(n);
                continue;
            }
            try {
                out.config.set(key, value);
            } catch (const sfu::Error &e) {
                // The library's message names the key and never quotes a password.
                error = file + ": " + e.message();
                if (e.status() == SFU_ERR_INVALID_ARGUMENT) {
                    error += std::string(" (the handler's own keys: ") + OWN_KEYS + ")";
                }
                g_list_free(items);
                return std::nullopt;
            }
            if (key == "redis_url") {
                url = value;
            } else if (shown(key)) {
                shown_parts.push_back(key + "=" + value);
            } else if (named_only(key)) {
                named.push_back(key);
            }
        }
    } catch (...) {
        g_list_free(items);
        throw;
    }
    g_list_free(items);

    try {
        out.config.validate();
    } catch (const sfu::Error &e) {
        error = file + ": " + e.message();
        return std::nullopt;
    }
    std::string summary = "redis " + redact_url(url);
    for (const auto &p : shown_parts) {
        summary += ", " + p;
    }
    if (!named.empty()) {
        summary += ", set:";
        for (const auto &n : named) {
            summary += " " + n;
        }
    }
    summary += ", queue_capacity=" + std::to_string(out.queue_capacity);
    out.summary = summary;
    return out;
}

} // namespace sfuredis

//! `SfuConfig`: a configuration built from key/value setters.

use std::ffi::c_char;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{arg_str, boundary, boundary_void, not_null, Fail, SfuStatus};
use sfu_redis::Error;
use sfu_redis::{Config, ConfigBuilder, Timings};

/// A configuration under construction (opaque). Create it with `sfu_config_new` or
/// `sfu_config_from_env`, change it with `sfu_config_set` / `sfu_config_set_ms`, pass it to
/// `sfu_node_start` (which copies it: the config can be changed, reused or freed afterwards),
/// release it with `sfu_config_free`. Internally locked: any thread may use it.
///
/// Keys of `sfu_config_set` (values are strings):
///
/// | key | default | value |
/// |---|---|---|
/// | `redis_url` | empty | `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS), `redis+sentinel://[user:password@]host1:port1,host2:port2/<master-name>[/db]`, `rediss+sentinel://...`; empty = memory-only mode |
/// | `tls_ca_file` | unset | CA certificate file (PEM) the server must chain to (TLS URLs; unset: the system's roots) |
/// | `tls_cert_file` | unset | client certificate file (PEM) for mutual TLS, with `tls_key_file` |
/// | `tls_key_file` | unset | private key file (PEM) of `tls_cert_file` |
/// | `tls_insecure` | `0` | `1`: skip TLS certificate verification (tests only; warned at every connect) |
/// | `sentinel_user` | unset | user the sentinels authenticate (sentinel URLs) |
/// | `sentinel_password` | unset | the sentinels' password (sentinel URLs); never printed |
/// | `namespace` | `sfu` | first key prefix segment |
/// | `stage` | `dev` | second key prefix segment |
/// | `branch` | `main` | third key prefix segment |
/// | `instance_id` | `<host>-<pid>-<8 hex>` | this instance's id (a new default at each start) |
/// | `timings` | `default` | preset: `default` (10 s heartbeat, 30 s TTL, ...), `fast` (ms scale, for tests and demos), or `from_heartbeat:<interval_ms>,<ttl_ms>` (every other timing derived with the design's ratios, as `Timings::from_heartbeat`); replaces every timing. The `*_ms` keys below each set one timing and derive nothing |
/// | `heartbeat_interval_ms` | 10000 | a timing, in ms (also settable with `sfu_config_set_ms`) |
/// | `heartbeat_ttl_ms` | 30000 | |
/// | `stale_threshold_ms` | 45000 | |
/// | `pin_ttl_ms` | 90000 | |
/// | `lease_ttl_ms` | 90000 | |
/// | `lease_refresh_ms` | 30000 | |
/// | `two_phase_delay_ms` | 60000 | |
/// | `reap_interval_ms` | 15000 | |
/// | `command_timeout_ms` | 2000 | |
/// | `reap_batch` | 500 | rooms of a dead instance's index the reaper handles per batch, 1 to 10000 |
/// | `reap_pace` | `1` | after each reap batch the reaper pauses this many times the batch's duration (a decimal number, 0 = no pause, at most 100) |
///
/// The rules between values (for example `heartbeat_interval_ms < heartbeat_ttl_ms`) are
/// checked by `sfu_config_validate` and `sfu_node_start`, not by the setters.
#[derive(Debug)]
pub struct SfuConfig {
    inner: Mutex<ConfigState>,
}

#[derive(Debug, Clone)]
struct ConfigState {
    builder: ConfigBuilder,
    timings: Timings,
}

impl SfuConfig {
    fn new(builder: ConfigBuilder) -> SfuConfig {
        SfuConfig {
            inner: Mutex::new(ConfigState {
                builder,
                timings: Timings::default(),
            }),
        }
    }

    /// Validates and builds the configuration.
    pub(crate) fn build(&self) -> Result<Config, Error> {
        let st = self.inner.lock().clone();
        st.builder.timings(st.timings).build()
    }
}

type TimingField = fn(&mut Timings) -> &mut Duration;

/// Timing keys: the C key, the field name used in error messages, the field.
const TIMING_KEYS: [(&str, &str, TimingField); 9] = [
    ("heartbeat_interval_ms", "heartbeat_interval", |t| {
        &mut t.heartbeat_interval
    }),
    ("heartbeat_ttl_ms", "heartbeat_ttl", |t| {
        &mut t.heartbeat_ttl
    }),
    ("stale_threshold_ms", "stale_threshold", |t| {
        &mut t.stale_threshold
    }),
    ("pin_ttl_ms", "pin_ttl", |t| &mut t.pin_ttl),
    ("lease_ttl_ms", "lease_ttl", |t| &mut t.lease_ttl),
    ("lease_refresh_ms", "lease_refresh", |t| {
        &mut t.lease_refresh
    }),
    ("two_phase_delay_ms", "two_phase_delay", |t| {
        &mut t.two_phase_delay
    }),
    ("reap_interval_ms", "reap_interval", |t| {
        &mut t.reap_interval
    }),
    ("command_timeout_ms", "command_timeout", |t| {
        &mut t.command_timeout
    }),
];

const STRING_KEYS: [&str; 14] = [
    "redis_url",
    "namespace",
    "stage",
    "branch",
    "instance_id",
    "timings",
    "reap_batch",
    "reap_pace",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "tls_insecure",
    "sentinel_user",
    "sentinel_password",
];

fn unknown_key(key: &str) -> Fail {
    let timing: Vec<&str> = TIMING_KEYS.iter().map(|k| k.0).collect();
    Fail::new(
        SfuStatus::SFU_ERR_INVALID_ARGUMENT,
        format!(
            "unknown configuration key {key:?}; known keys: {}, {}",
            STRING_KEYS.join(", "),
            timing.join(", ")
        ),
    )
}

fn set_timing(st: &mut ConfigState, key: &str, ms: u64) -> Result<(), Fail> {
    let Some((_, _, field)) = TIMING_KEYS.iter().find(|k| k.0 == key) else {
        return Err(unknown_key(key));
    };
    *field(&mut st.timings) = Duration::from_millis(ms);
    Ok(())
}

/// `from_heartbeat:<interval_ms>,<ttl_ms>` -> the two numbers.
fn parse_from_heartbeat(value: &str) -> Option<(u64, u64)> {
    let (interval, ttl) = value.strip_prefix("from_heartbeat:")?.split_once(',')?;
    Some((interval.trim().parse().ok()?, ttl.trim().parse().ok()?))
}

fn set(st: &mut ConfigState, key: &str, value: &str) -> Result<(), Fail> {
    let take = |st: &mut ConfigState| std::mem::take(&mut st.builder);
    match key {
        "redis_url" => st.builder = take(st).redis_url(Some(value)),
        "namespace" => st.builder = take(st).namespace(value),
        "stage" => st.builder = take(st).stage(value),
        "branch" => st.builder = take(st).branch(value),
        "instance_id" => st.builder = take(st).instance_id(value),
        "tls_ca_file" => st.builder = take(st).tls_ca_file(value),
        "tls_cert_file" => st.builder = take(st).tls_cert_file(value),
        "tls_key_file" => st.builder = take(st).tls_key_file(value),
        "tls_insecure" => {
            let on = match value.trim() {
                "" => false,
                v => sfu_redis::config::parse_switch(v).ok_or_else(|| {
                    Fail::from(config_error(
                        "tls_insecure",
                        format!("{v:?}: expected \"1\" or \"0\""),
                    ))
                })?,
            };
            st.builder = take(st).tls_insecure(on);
        }
        "sentinel_user" => st.builder = take(st).sentinel_user(value),
        "sentinel_password" => st.builder = take(st).sentinel_password(value),
        "reap_batch" => {
            let n = value.trim().parse::<usize>().map_err(|_| {
                Fail::from(config_error(
                    "reap_batch",
                    format!("{value:?} is not a whole number"),
                ))
            })?;
            st.builder = take(st).reap_batch(n);
        }
        // Range and finiteness are checked at validation, as for `reap_batch`.
        "reap_pace" => {
            let p = value.trim().parse::<f64>().map_err(|_| {
                Fail::from(config_error(
                    "reap_pace",
                    format!("{value:?} is not a number"),
                ))
            })?;
            st.builder = take(st).reap_pace(p);
        }
        "timings" => {
            st.timings = match value {
                "default" => Timings::default(),
                "fast" => Timings::fast(),
                _ => match parse_from_heartbeat(value) {
                    Some((interval, ttl)) => Timings::from_heartbeat(
                        Duration::from_millis(interval),
                        Duration::from_millis(ttl),
                    ),
                    None => {
                        return Err(config_error(
                    "timings",
                            format!(
                                "{value:?} is not a preset; use \"default\", \"fast\" or \"from_heartbeat:<interval_ms>,<ttl_ms>\""
                            ),
                        )
                        .into())
                    }
                },
            }
        }
        _ => {
            let Some((_, name, _)) = TIMING_KEYS.iter().find(|k| k.0 == key) else {
                return Err(unknown_key(key));
            };
            let ms = value.trim().parse::<u64>().map_err(|_| {
                Fail::from(config_error(
                    name,
                    format!("{value:?} is not a whole number of milliseconds"),
                ))
            })?;
            set_timing(st, key, ms)?;
        }
    }
    Ok(())
}

/// Creates a configuration with the defaults (memory-only, prefix `sfu:dev:main`, a generated
/// instance id, the default timings) and writes it to `*out_config`; release it with
/// `sfu_config_free`.
///
/// # Safety
/// `out_config` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_config_new(out_config: *mut *mut SfuConfig) -> SfuStatus {
    boundary(|| {
        not_null(out_config, "out_config")?;
        let cfg = Box::into_raw(Box::new(SfuConfig::new(ConfigBuilder::default())));
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_config.write(cfg) };
        Ok(())
    })
}

/// Creates a configuration from the environment (`REDIS_URL`, `SFU_NAMESPACE`, `SFU_STAGE`,
/// `SFU_BRANCH`, `SFU_INSTANCE_ID`, `SFU_REAP_PACE`; unset or empty variables keep the defaults) and writes it to
/// `*out_config`; release it with `sfu_config_free`.
///
/// # Safety
/// `out_config` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_config_from_env(out_config: *mut *mut SfuConfig) -> SfuStatus {
    boundary(|| {
        not_null(out_config, "out_config")?;
        let cfg = Box::into_raw(Box::new(SfuConfig::new(ConfigBuilder::from_env())));
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_config.write(cfg) };
        Ok(())
    })
}

/// Sets `key` to `value` (both borrowed); see `SfuConfig` for the keys. An unknown key fails
/// with `SFU_ERR_INVALID_ARGUMENT`, a timing that is not a whole number of ms or an unknown
/// `timings` preset with `SFU_ERR_INVALID_CONFIG`; the config is then unchanged.
///
/// # Safety
/// `config` is NULL or a live config; `key` and `value` are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn sfu_config_set(
    config: *mut SfuConfig,
    key: *const c_char,
    value: *const c_char,
) -> SfuStatus {
    boundary(|| {
        not_null(config, "config")?;
        // SAFETY: per the contract.
        let (key, value) = unsafe { (arg_str(key, "key")?, arg_str(value, "value")?) };
        // SAFETY: non-NULL and live per the contract.
        let cfg = unsafe { &*config };
        set(&mut cfg.inner.lock(), key, value)
    })
}

/// Sets the timing `key` (one of the `*_ms` keys of `SfuConfig`) to `ms` milliseconds. Any
/// other key fails with `SFU_ERR_INVALID_ARGUMENT`. Zero is accepted here and refused by
/// `sfu_config_validate` / `sfu_node_start`.
///
/// # Safety
/// `config` is NULL or a live config; `key` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn sfu_config_set_ms(
    config: *mut SfuConfig,
    key: *const c_char,
    ms: u64,
) -> SfuStatus {
    boundary(|| {
        not_null(config, "config")?;
        // SAFETY: per the contract.
        let key = unsafe { arg_str(key, "key")? };
        // SAFETY: non-NULL and live per the contract.
        let cfg = unsafe { &*config };
        set_timing(&mut cfg.inner.lock(), key, ms)
    })
}

/// Checks the whole configuration as `sfu_node_start` would, without connecting:
/// `SFU_ERR_INVALID_CONFIG` with a message naming the field at fault (an unparsable Redis URL,
/// an empty prefix segment, an invalid instance id, timings that break a rule).
///
/// # Safety
/// `config` is NULL or a live config.
#[no_mangle]
pub unsafe extern "C" fn sfu_config_validate(config: *const SfuConfig) -> SfuStatus {
    boundary(|| {
        not_null(config, "config")?;
        // SAFETY: non-NULL and live per the contract.
        let cfg = unsafe { &*config };
        cfg.build()?;
        Ok(())
    })
}

/// Releases a configuration. NULL is a no-op. Nodes started from it are not affected.
///
/// # Safety
/// `config` is NULL or a config from `sfu_config_new` / `sfu_config_from_env` not freed yet.
#[no_mangle]
pub unsafe extern "C" fn sfu_config_free(config: *mut SfuConfig) {
    boundary_void(|| {
        if !config.is_null() {
            // SAFETY: allocated by `Box::into_raw` in this module, per the contract.
            drop(unsafe { Box::from_raw(config) });
        }
    });
}

/// An `InvalidConfig` error naming the C key's field.
fn config_error(field: &'static str, reason: String) -> Error {
    Error::InvalidConfig { field, reason }
}

/// The reader of the book's reference pages the tests share (`tests/it/support/pages.rs`).
#[cfg(test)]
#[path = "../../tests/it/support/pages.rs"]
mod pages;

/// The C keys against docs/src/reference/configuration.md, both ways (issue 30, item 3): the
/// keys `sfu_config_set` knows ([`STRING_KEYS`], [`TIMING_KEYS`]) are exactly those of the page's
/// "C keys" table and of its Settings table's `C key` column, each in the row of the setting
/// it sets; and `sfu_config_set` takes every key the page names.
#[cfg(test)]
mod reference_tests {
    use super::*;

    use std::collections::BTreeSet;

    use pages::{Page, CONFIGURATION};

    #[test]
    fn c_keys_are_those_of_the_configuration_reference() {
        let known: BTreeSet<&str> = STRING_KEYS
            .iter()
            .copied()
            .chain(TIMING_KEYS.iter().map(|k| k.0))
            .collect();
        let page = Page::reference("configuration.md");
        let mut problems = Vec::new();

        let table = page
            .section("C keys")
            .and_then(|s| s.table_with("key"))
            .unwrap_or_else(|| panic!("{CONFIGURATION}: no table of keys under `## C keys`"));
        let mut listed = BTreeSet::new();
        for row in &table.rows {
            for key in pages::identifiers_in(table.cell(row, 0)) {
                // sfu_config_set takes it (a wrong value is another error).
                let value = match key.as_str() {
                    "timings" => "default",
                    "tls_insecure" => "0",
                    _ => "1",
                };
                let mut st = SfuConfig::new(ConfigBuilder::default()).inner.into_inner();
                if let Err(f) = set(&mut st, &key, value) {
                    if f.message.starts_with("unknown configuration key") {
                        problems.push(format!(
                            "{CONFIGURATION}:{}: sfu_config_set does not know the key `{key}`",
                            row.line
                        ));
                    }
                }
                listed.insert(key);
            }
        }
        for key in &known {
            if !listed.contains(*key) {
                problems.push(format!(
                    "sfu_config_set takes the key `{key}`, which the table under `## C keys` of {CONFIGURATION} does not list"
                ));
            }
        }
        for key in &listed {
            if !known.contains(key.as_str()) {
                problems.push(format!(
                    "the table under `## C keys` of {CONFIGURATION} lists `{key}`, which is no key of sfu_config_set (capi/src/config.rs: STRING_KEYS, TIMING_KEYS)"
                ));
            }
        }

        let mut in_settings = BTreeSet::new();
        for row in pages::setting_rows(&page) {
            for key in &row.c_keys {
                in_settings.insert(key.clone());
                // A timing key sets the `Timings` field the row is about; another key, the
                // setting of its name.
                let sets = TIMING_KEYS
                    .iter()
                    .find(|k| k.0 == key)
                    .map_or(key.as_str(), |k| k.1);
                if !known.contains(key.as_str()) {
                    problems.push(format!(
                        "{CONFIGURATION}:{}: the C key `{key}` of the Settings table is no key of sfu_config_set",
                        row.line
                    ));
                } else if !row.names.iter().any(|n| n == sets) {
                    problems.push(format!(
                        "{CONFIGURATION}:{}: the C key `{key}` sets `{sets}`, not this row's {:?}",
                        row.line, row.names
                    ));
                }
            }
        }
        for key in &known {
            if !in_settings.contains(*key) {
                problems.push(format!(
                    "sfu_config_set takes the key `{key}`, which the Settings table of {CONFIGURATION} names in no row's `C key` column"
                ));
            }
        }
        assert!(
            problems.is_empty(),
            "{} difference(s) between the reference and the C ABI (fix {CONFIGURATION}, or capi/src/config.rs if the code is wrong):\n{}",
            problems.len(),
            problems.join("\n")
        );
    }
}

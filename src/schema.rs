//! The key schema version of a prefix, and the steps that move a prefix from one version to
//! the next (`sfu-redis migrate`).
//!
//! A prefix records the layout its keys are in under `P:{ctl}:schema` ([`KeySpace::schema`]),
//! a decimal string. This release reads and writes version [`SCHEMA_VERSION`]. Prefixes
//! written before versions existed carry no stamp; their layout is version 1. The first
//! heartbeat that finds the stamp missing writes it (`heartbeat.lua`), and a registration on a
//! prefix stamped with another version is refused ([`Error::Schema`]), so a node never writes
//! one layout's keys into another's (docs/DESIGN.md "Schema version").
//!
//! [`migrate`] plans (`apply: false`) or runs the steps from the prefix's version to this
//! release's. Each step is safe while a fleet runs unless its documentation says otherwise;
//! today there is one: stamping an unstamped prefix with version 1.

use crate::config::Config;
use crate::conn::Redis;
use crate::error::{Error, Result};
use crate::keys::{KeySpace, SCHEMA_VERSION};

/// One step of a migration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrateStep {
    /// The version the step starts from; 0 for an unstamped prefix.
    pub from: u32,
    /// The version the prefix is in after the step.
    pub to: u32,
    /// What the step does, for people (one sentence).
    pub action: String,
    /// The step ran (only with `apply`).
    pub done: bool,
}

/// What [`migrate`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrateReport {
    /// `<namespace>:<stage>:<branch>`.
    pub prefix: String,
    /// What the stamp held before: `None` when it was missing.
    pub found: Option<String>,
    /// The version this release speaks ([`SCHEMA_VERSION`]).
    pub speaks: u32,
    /// The steps from `found` to `speaks`, in order (empty: nothing to do).
    pub steps: Vec<MigrateStep>,
    /// Steps were run (`apply`), not only planned.
    pub applied: bool,
}

/// The refusal of a prefix stamped `found`: [`Error::Schema`] naming this release's version.
pub(crate) fn refused(ks: &KeySpace, found: String) -> Error {
    Error::Schema {
        prefix: ks.prefix().to_owned(),
        found,
        speaks: SCHEMA_VERSION,
    }
}

/// Reads `P:{ctl}:schema` on `con`: `None` when missing; bytes that are not UTF-8 are
/// replaced (such a stamp names no version). A key of another type is bad data.
pub(crate) fn read_stamp(
    con: &mut impl redis::ConnectionLike,
    ks: &KeySpace,
) -> Result<Option<String>> {
    let key = ks.schema();
    redis::cmd("GET")
        .arg(&key)
        .query::<Option<Vec<u8>>>(con)
        .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
        .map_err(|e| Error::redis(format!("read the key schema version {key}"), e))
}

/// The version a stamp names, or [`Error::Schema`] when this release cannot move a prefix
/// from it (a newer version, or not a version as a release writes one: `"01"`, `" 1"` are
/// refused, as `heartbeat.lua` compares the exact string).
fn stamped_version(ks: &KeySpace, found: &str) -> Result<u32> {
    match crate::error::stamp_version(found) {
        Some(v) if (1..=SCHEMA_VERSION).contains(&v) => Ok(v),
        _ => Err(refused(ks, found.to_owned())),
    }
}

/// Plans (`apply` false: nothing is written) or runs the steps that bring `config`'s prefix
/// to [`SCHEMA_VERSION`]. Errors: [`Error::Schema`] when the prefix is stamped with a version
/// this release does not know (newer, or not a number): nothing is written;
/// [`crate::ErrorKind::Redis`] when Redis cannot be reached; bad data when the stamp is not a
/// string; an invalid configuration without a Redis URL.
pub fn migrate(config: &Config, apply: bool) -> Result<MigrateReport> {
    if config.redis_url().is_none() {
        return Err(Error::config(
            "redis_url",
            "migrate works on a prefix in Redis (set REDIS_URL); memory-only mode has no key schema",
        ));
    }
    let ks = config.keys();
    let redis = Redis::from_config(config)?;
    let mut con = redis.connect()?;
    let found = read_stamp(&mut con, ks)?;
    let mut report = MigrateReport {
        prefix: ks.prefix().to_owned(),
        found: found.clone(),
        speaks: SCHEMA_VERSION,
        steps: Vec::new(),
        applied: apply,
    };
    let from = match &found {
        None => 0,
        Some(f) => stamped_version(ks, f)?,
    };
    if from == 0 {
        // The one step today: stamping an unstamped prefix (layout 1).
        if apply {
            stamp(&mut con, ks, 1)?;
        }
        report.steps.push(MigrateStep {
            from: 0,
            to: 1,
            action: format!(
                "stamp the prefix with version 1 ({} = 1): it carries no stamp, so its keys are in layout 1 (written before versions existed)",
                ks.schema()
            ),
            done: apply,
        });
    }
    Ok(report)
}

/// Writes version `v` where no stamp is (`SET NX`): a node that stamped meanwhile wrote the
/// same version or refuses to register on ours. Another version found then is an
/// [`Error::Schema`]; a stamp deleted again between the two commands is written again.
fn stamp(con: &mut impl redis::ConnectionLike, ks: &KeySpace, v: u32) -> Result<()> {
    let op = "write the key schema version";
    for _ in 0..3 {
        let set: Option<String> = redis::cmd("SET")
            .arg(ks.schema())
            .arg(v)
            .arg("NX")
            .query(con)
            .map_err(|e| Error::redis(op, e))?;
        if set.is_some() {
            return Ok(());
        }
        match read_stamp(con, ks)? {
            None => continue,
            Some(now) if now == v.to_string() => return Ok(()),
            Some(now) => return Err(refused(ks, now)),
        }
    }
    Err(Error::bad_data(
        op,
        format!(
            "{} was deleted three times while being written",
            ks.schema()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_names_a_version_this_release_can_move_from_or_is_refused() {
        let ks = KeySpace::new("sfu", "dev", "main").unwrap();
        assert_eq!(stamped_version(&ks, "1").unwrap(), 1);
        for bad in ["2", "0", "-1", "one", "", "1.0", "01", "+1", " 1", "1\n"] {
            let e = stamped_version(&ks, bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Schema, "{bad:?}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains("speaks version 1"), "{msg}");
            assert!(msg.contains("sfu:dev:main"), "{msg}");
        }
        // Garbage of any size makes a message of one short line.
        let e = stamped_version(&ks, &"x".repeat(100_000)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.len() < 500, "{} bytes", msg.len());
        assert!(msg.contains(&format!("{}...", "x".repeat(64))), "{msg}");
    }
}

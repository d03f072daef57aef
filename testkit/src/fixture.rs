//! Prefixes dumped key by key as JSON (`tests/fixtures/*.json`, written by a release's own
//! processes: `tests/fixtures/README.md`), parsed and written into a test server.
//!
//! The format: `{"prefix": "<namespace>:<stage>:<branch>", "keys": [{"key", "type", "pttl",
//! "value"}, ...]}`, `type` one of `string` (value a string), `hash` (an object of strings),
//! `set` (an array of strings), `zset` (an array of `[member, score]`); `pttl` is the key's
//! `PTTL` at the dump in ms (-1: none).

use redis::{ConnectionLike, RedisResult};
use serde_json::Value;

/// One key of a [`Fixture`].
#[derive(Debug, Clone, PartialEq)]
pub struct FixtureKey {
    /// The key's name.
    pub key: String,
    /// `string`, `hash`, `set` or `zset`.
    pub kind: String,
    /// Its time to live at the dump, ms (-1: none).
    pub pttl: i64,
    /// Its contents, as the format says.
    pub value: Value,
}

/// A dumped prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct Fixture {
    /// `<namespace>:<stage>:<branch>`.
    pub prefix: String,
    /// Its keys, in the dump's order.
    pub keys: Vec<FixtureKey>,
}

/// Whether [`Fixture::load`] gives keys their dumped time to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// Every key without expiry: the prefix frozen as it was at the dump (a test removes
    /// what it wants gone, e.g. a heartbeat key or a lease).
    Frozen,
    /// A key with a `pttl` gets that many ms from the load (the dump's state, its clock
    /// running from the load).
    AsDumped,
}

fn field<'a>(v: &'a Value, name: &str, at: &str) -> Result<&'a Value, String> {
    v.get(name).ok_or_else(|| format!("{at}: no {name:?}"))
}

fn string(v: &Value, at: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{at}: {v} is not a string"))
}

impl Fixture {
    /// Parses a fixture; the error says which key is malformed.
    pub fn parse(text: &str) -> Result<Fixture, String> {
        let doc: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let prefix = string(field(&doc, "prefix", "fixture")?, "prefix")?;
        let mut keys = Vec::new();
        for (n, k) in field(&doc, "keys", "fixture")?
            .as_array()
            .ok_or("\"keys\" is not an array")?
            .iter()
            .enumerate()
        {
            let at = format!("key {n}");
            let key = string(field(k, "key", &at)?, &at)?;
            let kind = string(field(k, "type", &key)?, &key)?;
            let pttl = field(k, "pttl", &key)?
                .as_i64()
                .ok_or_else(|| format!("{key}: pttl is not a number"))?;
            let value = field(k, "value", &key)?.clone();
            let fk = FixtureKey {
                key,
                kind,
                pttl,
                value,
            };
            fk.check()?;
            keys.push(fk);
        }
        Ok(Fixture { prefix, keys })
    }

    /// The key named `key`, if the fixture has it.
    pub fn get(&self, key: &str) -> Option<&FixtureKey> {
        self.keys.iter().find(|k| k.key == key)
    }

    /// Writes every key into `con` (each deleted first), in one pipeline: on a cluster
    /// connection (`sfu_redis::ops::conn::Conn`) every command goes to the master of its key's
    /// slot. With [`Ttl::AsDumped`] a key that had a time to live gets it again.
    pub fn load(&self, con: &mut impl ConnectionLike, ttl: Ttl) -> RedisResult<()> {
        let mut pipe = redis::pipe();
        for k in &self.keys {
            k.write(&mut pipe);
            if ttl == Ttl::AsDumped && k.pttl > 0 {
                pipe.cmd("PEXPIRE").arg(&k.key).arg(k.pttl).ignore();
            }
        }
        pipe.query(con)
    }
}

impl FixtureKey {
    fn check(&self) -> Result<(), String> {
        let bad = |what: &str| {
            Err(format!(
                "{}: a {} whose value is not {what}",
                self.key, self.kind
            ))
        };
        let ok = match self.kind.as_str() {
            "string" => self.value.is_string(),
            "hash" => self
                .value
                .as_object()
                .is_some_and(|o| o.values().all(Value::is_string)),
            "set" => self
                .value
                .as_array()
                .is_some_and(|a| a.iter().all(Value::is_string)),
            "zset" => self.value.as_array().is_some_and(|a| {
                a.iter().all(|e| {
                    e.as_array()
                        .is_some_and(|p| p.len() == 2 && p[0].is_string() && p[1].is_number())
                })
            }),
            other => return Err(format!("{}: type {other:?} is not loaded", self.key)),
        };
        if ok {
            Ok(())
        } else {
            bad(match self.kind.as_str() {
                "string" => "a string",
                "hash" => "an object of strings",
                "set" => "an array of strings",
                _ => "an array of [member, score]",
            })
        }
    }

    /// The commands that write this key (checked by [`Fixture::parse`]).
    fn write(&self, pipe: &mut redis::Pipeline) {
        pipe.cmd("DEL").arg(&self.key).ignore();
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        match self.kind.as_str() {
            "string" => {
                pipe.cmd("SET").arg(&self.key).arg(s(&self.value)).ignore();
            }
            "hash" => {
                let cmd = pipe.cmd("HSET").arg(&self.key);
                for (f, v) in self.value.as_object().into_iter().flatten() {
                    cmd.arg(f).arg(s(v));
                }
                cmd.ignore();
            }
            "set" => {
                let cmd = pipe.cmd("SADD").arg(&self.key);
                for m in self.value.as_array().into_iter().flatten() {
                    cmd.arg(s(m));
                }
                cmd.ignore();
            }
            _ => {
                let cmd = pipe.cmd("ZADD").arg(&self.key);
                for e in self.value.as_array().into_iter().flatten() {
                    // Scores as Redis printed them (`1796403549223` or `1.5`): integers stay
                    // exact.
                    let score = match &e[1] {
                        Value::Number(n) => n
                            .as_i64()
                            .map(|i| i.to_string())
                            .or_else(|| {
                                n.as_f64().map(|f| {
                                    if f.fract() == 0.0 && f.abs() < 9e15 {
                                        format!("{}", f as i64)
                                    } else {
                                        f.to_string()
                                    }
                                })
                            })
                            .unwrap_or_default(),
                        _ => String::new(),
                    };
                    cmd.arg(score).arg(s(&e[0]));
                }
                cmd.ignore();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_type_and_refuses_a_malformed_key() {
        let f = Fixture::parse(
            r#"{"prefix": "sfu:x:main", "keys": [
                {"key": "s", "type": "string", "pttl": -1, "value": "v"},
                {"key": "h", "type": "hash", "pttl": 500, "value": {"a": "1"}},
                {"key": "m", "type": "set", "pttl": -1, "value": ["a", "b"]},
                {"key": "z", "type": "zset", "pttl": -1, "value": [["a", 0], ["b", 1796403549223.0]]}
            ]}"#,
        )
        .unwrap();
        assert_eq!(f.prefix, "sfu:x:main");
        assert_eq!(f.keys.len(), 4);
        assert_eq!(f.get("h").unwrap().pttl, 500);
        for bad in [
            r#"{"prefix": "p", "keys": [{"key": "h", "type": "hash", "pttl": -1, "value": {"a": 1}}]}"#,
            r#"{"prefix": "p", "keys": [{"key": "l", "type": "list", "pttl": -1, "value": []}]}"#,
            r#"{"prefix": "p", "keys": [{"key": "z", "type": "zset", "pttl": -1, "value": [["a"]]}]}"#,
            r#"{"prefix": "p", "keys": [{"key": "s", "type": "string", "value": "v"}]}"#,
        ] {
            assert!(Fixture::parse(bad).is_err(), "{bad}");
        }
    }
}

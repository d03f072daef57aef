//! How doctor runs a check on each server: one connection for the whole run, and the masters
//! that stopped answering remembered, so the later checks do not wait for them again; and the
//! progress line on a terminal.
//!
//! A master (one server: the server) that cannot be connected to, or whose check meets a
//! timeout or a dropped connection, is "down" for the rest of the run: every later check says
//! `not checked: <master> did not answer in check <name>` for it, with status `fail`, without
//! sending it anything. A master paused with SIGSTOP thus costs one connect attempt in all
//! instead of one per check (about 60 s with the default 2 s timeout on a 3-master cluster
//! before).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redis::{Cmd, Connection, ConnectionLike, RedisError, RedisResult, Value};
use sfu_redis::ops::conn::Conn;

use super::{merge, Status};

/// The server connection(s) of the run and the masters that stopped answering.
pub(super) struct Servers<'a> {
    con: &'a mut Conn,
    /// The one server's label (standalone or sentinel-named master), for messages.
    one: String,
    /// `(master, the check it stopped answering in)`, in the order found.
    down: Vec<(String, &'static str)>,
    steps: &'a Steps,
}

impl<'a> Servers<'a> {
    /// `one`: how to name the server when `con` is not a cluster connection.
    pub(super) fn new(con: &'a mut Conn, one: String, steps: &'a Steps) -> Servers<'a> {
        Servers {
            con,
            one,
            down: Vec::new(),
            steps,
        }
    }

    /// Marks `m` down: it did not answer in check `name`.
    pub(super) fn mark_down(&mut self, m: &str, name: &'static str) {
        if self.down_note(m).is_none() {
            self.down.push((m.to_owned(), name));
        }
    }

    /// The connection, for calls that are not per server (the fleet's status).
    pub(super) fn con(&mut self) -> &mut Conn {
        self.con
    }

    /// The labels of the servers: every master of a cluster (`host:port`), else the one.
    pub(super) fn labels(&self) -> Vec<String> {
        if self.con.is_cluster() {
            self.con.cluster_masters()
        } else {
            vec![self.one.clone()]
        }
    }

    /// `not checked: <m> did not answer in check <name>` when `m` is down.
    pub(super) fn down_note(&self, m: &str) -> Option<String> {
        self.down
            .iter()
            .find(|(d, _)| d == m)
            .map(|(d, check)| format!("not checked: {d} did not answer in check {check}"))
    }

    /// Runs check `name` (`f`) on each server not down, in master order: one `(label,
    /// (status, detail))` per server. A server that cannot be reached, or stops answering
    /// during `f`, fails and is down from now on.
    pub(super) fn each(
        &mut self,
        name: &'static str,
        f: &dyn Fn(&mut dyn ConnectionLike) -> (Status, String),
    ) -> Vec<(String, (Status, String))> {
        let labels = self.labels();
        self.steps.check(name, &labels, &self.down);
        if !self.con.is_cluster() {
            if let Some(note) = self.down_note(&self.one) {
                return vec![(self.one.clone(), (Status::Fail, note))];
            }
        }
        let down = &self.down;
        let results = self.con.on_each_server_except(
            |m| down.iter().any(|(d, _)| d == m),
            |c| {
                let mut w = Watched::new(c);
                let out = f(&mut w);
                match w.lost {
                    Some(e) => Err(e),
                    None => Ok(out),
                }
            },
        );
        let mut out = Vec::new();
        let mut newly = Vec::new();
        for (m, r) in labels.into_iter().zip(results) {
            let judged = match r {
                None => (
                    Status::Fail,
                    self.down_note(&m).unwrap_or_else(|| "not checked".into()),
                ),
                Some(Ok(judged)) => judged,
                Some(Err(e)) => {
                    newly.push(m.clone());
                    let e = e.to_string();
                    let detail = if e.contains(&m) {
                        e
                    } else {
                        format!("{m} did not answer: {e}")
                    };
                    (Status::Fail, detail)
                }
            };
            out.push((m, judged));
        }
        self.down.extend(newly.into_iter().map(|m| (m, name)));
        out
    }

    /// [`Servers::each`], merged into one result (`merge`: one detail when all agree, else
    /// `host:port: detail` for each master).
    pub(super) fn run(
        &mut self,
        name: &'static str,
        f: &dyn Fn(&mut dyn ConnectionLike) -> (Status, String),
    ) -> (Status, String) {
        let cluster = self.con.is_cluster();
        let (labels, results): (Vec<String>, Vec<(Status, String)>) =
            self.each(name, f).into_iter().unzip();
        merge(if cluster { &labels } else { &[] }, results)
    }

    /// Marks the step `name` as under way without a per-server call (the fleet's status).
    pub(super) fn step(&self, name: &'static str) {
        self.steps.check(name, &[], &self.down);
    }
}

/// True for an error that means the server did not answer (a timeout, a broken or dropped
/// connection), not a refusal.
fn did_not_answer(e: &RedisError) -> bool {
    e.code().is_none() && (e.is_timeout() || e.is_io_error() || e.is_connection_dropped())
}

/// A server connection that remembers the first error meaning the server did not answer; once
/// it has one it sends nothing more (a late reply must not be read as another command's).
struct Watched<'c> {
    con: &'c mut Connection,
    lost: Option<RedisError>,
}

impl<'c> Watched<'c> {
    fn new(con: &'c mut Connection) -> Self {
        Watched { con, lost: None }
    }

    /// `Err` without sending when the server already did not answer.
    fn usable(&self) -> RedisResult<()> {
        match &self.lost {
            None => Ok(()),
            Some(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "not sent: the server did not answer an earlier command",
            ))),
        }
    }

    fn watch<T>(&mut self, r: RedisResult<T>) -> RedisResult<T> {
        match r {
            Err(e) if did_not_answer(&e) && self.lost.is_none() => {
                let again = RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    super::server::reason(&e),
                ));
                self.lost = Some(e);
                Err(again)
            }
            r => r,
        }
    }
}

impl ConnectionLike for Watched<'_> {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.usable()?;
        let r = self.con.req_packed_command(cmd);
        self.watch(r)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.usable()?;
        let r = self.con.req_packed_commands(cmd, offset, count);
        self.watch(r)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.usable()?;
        let r = self.con.req_command(cmd);
        self.watch(r)
    }

    fn get_db(&self) -> i64 {
        self.con.get_db()
    }

    fn supports_pipelining(&self) -> bool {
        self.con.supports_pipelining()
    }

    fn check_connection(&mut self) -> bool {
        self.lost.is_none() && self.con.check_connection()
    }

    fn is_open(&self) -> bool {
        self.lost.is_none() && self.con.is_open()
    }
}

/// The progress line of a run on a terminal (stderr): `[3/9] persistence on 127.0.0.1:7001
/// 127.0.0.1:7002 ...`, with the time spent; nothing when stderr is not a terminal or with
/// `--json` (stdout keeps the report alone, logs and pipes get no escape codes).
pub(super) struct Steps {
    bar: Option<ProgressBar>,
}

impl Steps {
    /// `total` steps; shown only when `enabled` and stderr is a terminal.
    pub(super) fn new(enabled: bool, total: u64) -> Steps {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) =
                ProgressStyle::with_template("doctor {spinner} [{pos}/{len}] {msg} ({elapsed})")
            {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Steps { bar }
    }

    /// The check `name` begins on `servers` (none: not a per-server check); `down` are left
    /// out.
    pub(super) fn check(&self, name: &str, servers: &[String], down: &[(String, &str)]) {
        let Some(bar) = &self.bar else { return };
        bar.inc(1);
        let on: Vec<&str> = servers
            .iter()
            .filter(|s| !down.iter().any(|(d, _)| d == *s))
            .map(String::as_str)
            .collect();
        let mut msg = name.to_owned();
        if !on.is_empty() {
            msg.push_str(&format!(" on {}", on.join(" ")));
        }
        if !down.is_empty() {
            let skipped: Vec<&str> = down.iter().map(|(d, _)| d.as_str()).collect();
            msg.push_str(&format!(" (not answering, skipped: {})", skipped.join(" ")));
        }
        bar.set_message(msg);
    }

    /// Clears the line (the report follows on stdout).
    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        self.finish();
    }
}

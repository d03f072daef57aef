//! The Janus event handler (`integrations/janus`) end to end, on real processes: the C API
//! installed into a temp prefix (`capi/install.sh`, as `install.rs` does), the handler built
//! against it with CMake, one private `redis-server`, two `janus` processes (A with
//! VideoRoom's numeric ids, B with string ids), each with its own configuration folder, HTTP
//! and Admin API on free ports, no media; a client drives them through Janus's HTTP API.
//!
//! 1. Rooms on both instances, 20 participants, some leaving (leave, kick, handle detach,
//!    session destroyed), a reconnect with the same `opaque_id`, one room destroyed, one room
//!    that B creates while A holds it: the keys in Redis (pins, peer records, room indexes,
//!    guest pointers; each record in a room of its instance's room index) match what Janus lists (`list`, `listparticipants`); the Admin API's
//!    `where` and `stats` answer; `sfu-redis fsck` is clean.
//! 2. `kill -9` of A: within the documented bound B's node reaps A's rooms and participants,
//!    B's are untouched, `where` on B says `null` for A's rooms, fsck is clean. The time from
//!    the kill to the last key of A gone is printed.
//! 3. A starts again with the same instance id: it starts clean and records again. Killed
//!    again and started at once (before any reap), its earlier life's keys are gone once it is
//!    registered.
//! 4. SIGTERM of B: its leave removes everything it held; then of A: nothing of either is
//!    left.
//!
//! The handler logs in to Redis as an ACL user with a password: neither Janus log may show it.
//! Three more tests: Janus started while Redis is unreachable, then an outage that overflows
//! the handler's queue (`janus_runs_through_redis_outages_and_the_queue_catches_up`); refused
//! configurations (`a_bad_configuration_disables_the_handler_and_janus_runs_on`); the event
//! mapping on malformed events (`the_event_mapping_takes_janus_shapes_and_reports_bad_ones`).
//! One benchmark, `#[ignore]`d (`janus_load_*`: 1,000 participants through the HTTP API, see
//! its comment).
//! Needs cmake, make, pkg-config, g++, `janus` and `janus-dev` (Debian packages): without them
//! the test fails and says what to install. Janus's modules are looked up in
//! `JANUS_LIB_DIR` (default `/usr/lib/x86_64-linux-gnu/janus`).

mod ffi_support;
#[path = "../../tests/it/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sfu_redis::keys::{decode_id, KeySpace, ParsedKey};
use sfu_redis::Timings;

use ffi_support::{install_command, need, ok, root};
use support::{procs, wait_for, Direction, Server, Val, LONG};

const STAGE: &str = "janus";
const HANDLER: &str = "janus.eventhandler.sfuredis";
/// The Redis ACL user the handlers log in as, and its password (never in a Janus log).
const REDIS_USER: &str = "janus";
const REDIS_PASSWORD: &str = "Pw-0f-the-janus-handler";
const ADMIN_SECRET: &str = "sfu-admin-secret";
const ROOM_SECRET: &str = "room-secret";
const A: &str = "janus-a";
const B: &str = "janus-b";

/// This test binary's files, emptied once per process.
fn work_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("janus");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the work directory");
        dir
    })
}

/// A folder of one test's own.
fn test_dir(name: &str) -> PathBuf {
    let dir = work_dir().join(name);
    fs::create_dir_all(&dir).expect("create the test's directory");
    dir
}

fn janus_lib_dir() -> PathBuf {
    let dir = std::env::var_os("JANUS_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/x86_64-linux-gnu/janus"));
    for module in [
        "plugins/libjanus_videoroom.so",
        "transports/libjanus_http.so",
    ] {
        assert!(
            dir.join(module).exists(),
            "no {module} in {} (install janus: apt-get install -y janus janus-dev, or set JANUS_LIB_DIR)",
            dir.display()
        );
    }
    dir
}

/// The handler's shared object, built once per process: the C API installed into a prefix,
/// the handler built against it with CMake.
fn handler() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let started = Instant::now();
        let so = build_handler(work_dir());
        println!(
            "C API installed and handler built in {:?}",
            started.elapsed()
        );
        so
    })
}

fn build_handler(work: &Path) -> PathBuf {
    for (tool, pkg) in [
        ("cmake", "cmake"),
        ("make", "make"),
        ("pkg-config", "pkg-config"),
        ("g++", "g++"),
    ] {
        need(tool, pkg);
    }
    // `janus --version` exits 1 (it prints the version, then refuses the option).
    let janus = Command::new("janus")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        janus.is_ok_and(|s| s.success()),
        "`janus` is needed by this test: install it (Debian: apt-get install -y janus janus-dev)"
    );
    let prefix = work.join("prefix");
    ok(&mut install_command(&prefix), "capi/install.sh");
    let build = work.join("build");
    let source = root()
        .parent()
        .expect("the repository root")
        .join("integrations/janus");
    let configure = ok(
        Command::new("cmake")
            .arg("-S")
            .arg(&source)
            .arg("-B")
            .arg(&build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())),
        "cmake configure of integrations/janus",
    );
    assert!(
        configure.contains(&format!(
            "sfu_redis {} from {}/lib/cmake/sfu_redis",
            env!("CARGO_PKG_VERSION"),
            prefix.display()
        )),
        "{configure}"
    );
    ok(
        Command::new("cmake").arg("--build").arg(&build),
        "cmake --build of integrations/janus",
    );
    let so = build.join("libjanus_sfuredisevh.so");
    assert!(so.is_file(), "no {}", so.display());
    so
}

fn free_port(taken: &mut Vec<u16>) -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if !taken.contains(&port) {
            taken.push(port);
            return port;
        }
    }
}

fn tx() -> String {
    static N: AtomicU64 = AtomicU64::new(1);
    format!("t{}", N.fetch_add(1, Ordering::Relaxed))
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// One HTTP/1.1 exchange with `Connection: close`; the JSON body of a 200 answer.
fn try_http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(40)))
        .map_err(|e| e.to_string())?;
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {text:?}"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!("{method} {path}: {head}\n{body}"));
    }
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    serde_json::from_str(&body).map_err(|e| format!("{method} {path}: {e}: {body:?}"))
}

/// The body of a chunked HTTP/1.1 answer (Janus's HTTP transport sends them).
fn dechunk(mut rest: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, tail) = rest
            .split_once("\r\n")
            .ok_or_else(|| format!("bad chunk in {rest:?}"))?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("bad chunk size {size:?}: {e}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = tail
            .get(..size)
            .ok_or_else(|| format!("short chunk in {tail:?}"))?;
        out.push_str(chunk);
        rest = tail[size..]
            .strip_prefix("\r\n")
            .ok_or_else(|| "no CRLF after a chunk".to_owned())?;
    }
}

/// A Janus id (number or string) as the handler maps it: the decimal form or the string.
fn id_str(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        other => panic!("not a VideoRoom id: {other}"),
    }
}

/// One Janus process and its configuration folder.
struct Janus {
    name: &'static str,
    dir: PathBuf,
    http: u16,
    admin: u16,
    child: Option<Child>,
}

impl Janus {
    /// Writes the configuration of instance `name` (also its sfu-redis instance id): only
    /// VideoRoom, the HTTP transport (API and Admin API on loopback) and the handler are
    /// loaded; events are broadcast; no session timeout.
    fn configure(
        name: &'static str,
        work: &Path,
        handler: &Path,
        redis_url: &str,
        string_ids: bool,
        extra: &str,
        ports: &mut Vec<u16>,
    ) -> Janus {
        let lib = janus_lib_dir();
        let dir = work.join(name);
        let conf = dir.join("conf");
        for sub in ["conf", "plugins", "transports", "events", "loggers"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(
            lib.join("plugins/libjanus_videoroom.so"),
            dir.join("plugins/libjanus_videoroom.so"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            lib.join("transports/libjanus_http.so"),
            dir.join("transports/libjanus_http.so"),
        )
        .unwrap();
        fs::copy(handler, dir.join("events/libjanus_sfuredisevh.so")).unwrap();
        let (http, admin) = (free_port(ports), free_port(ports));
        let d = dir.display();
        let files = [
            (
                "janus.jcfg",
                format!(
                    "general: {{\n  configs_folder = \"{d}/conf\"\n  plugins_folder = \"{d}/plugins\"\n  \
                     transports_folder = \"{d}/transports\"\n  events_folder = \"{d}/events\"\n  \
                     loggers_folder = \"{d}/loggers\"\n  debug_level = 4\n  server_name = \"{name}\"\n  \
                     session_timeout = 0\n  admin_secret = \"{ADMIN_SECRET}\"\n}}\n\
                     media: {{\n}}\nnat: {{\n  ice_ignore_list = \"vmnet\"\n}}\n\
                     events: {{\n  broadcast = true\n  stats_period = 0\n}}\n"
                ),
            ),
            (
                "janus.transport.http.jcfg",
                format!(
                    "general: {{\n  json = \"compact\"\n  base_path = \"/janus\"\n  http = true\n  \
                     port = {http}\n  ip = \"127.0.0.1\"\n  https = false\n}}\n\
                     admin: {{\n  admin_base_path = \"/admin\"\n  admin_http = true\n  \
                     admin_port = {admin}\n  admin_ip = \"127.0.0.1\"\n  admin_https = false\n}}\n"
                ),
            ),
            (
                "janus.plugin.videoroom.jcfg",
                format!("general: {{\n  events = true\n  string_ids = {string_ids}\n}}\n"),
            ),
            (
                "janus.eventhandler.sfuredis.jcfg",
                format!(
                    "general: {{\n  enabled = true\n  redis_url = \"{redis_url}\"\n  stage = \"{STAGE}\"\n  \
                     instance_id = \"{name}\"\n  timings = \"fast\"\n  reap_pace = 0\n{extra}}}\n"
                ),
            ),
        ];
        for (file, text) in files {
            fs::write(conf.join(file), text).unwrap();
        }
        Janus {
            name,
            dir,
            http,
            admin,
            child: None,
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("janus.log")
    }

    fn log_text(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Replaces the handler's configuration file with `text`.
    fn set_handler_config(&self, text: &str) {
        fs::write(self.dir.join("conf").join(format!("{HANDLER}.jcfg")), text).unwrap();
    }

    /// Starts the process and waits until the API answers and the handler is registered
    /// with Redis.
    fn start(&mut self) {
        self.launch();
        self.wait_registered();
    }

    fn wait_registered(&self) {
        let name = self.name;
        wait_for(LONG, &format!("{name}: handler registered"), || {
            let s = self.try_admin(json!({"request": "stats"})).ok()?;
            (s["registered"] == true).then_some(())
        });
    }

    /// Starts the process (its output appended to `janus.log`) and waits until the API and
    /// the Admin API answer (the handler's answer may be an error).
    fn launch(&mut self) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let conf = self.dir.join("conf");
        let child = Command::new("janus")
            .arg("-C")
            .arg(conf.join("janus.jcfg"))
            .arg("-F")
            .arg(&conf)
            .arg("-o")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn janus");
        self.child = Some(child);
        let name = self.name;
        wait_for(LONG, &format!("{name}: API and Admin API up"), || {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("{name} exited at start: {st}\n{}", self.log_text());
            }
            try_http(self.http, "GET", "/janus/info", None).ok()?;
            self.try_admin(json!({"request": "stats"})).ok()
        });
    }

    fn api(&self, path: &str, body: Value) -> Value {
        try_http(self.http, "POST", path, Some(&body))
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", self.name, self.log_tail()))
    }

    fn try_admin(&self, request: Value) -> Result<Value, String> {
        let body = json!({
            "janus": "query_eventhandler",
            "handler": HANDLER,
            "request": request,
            "admin_secret": ADMIN_SECRET,
            "transaction": tx(),
        });
        let r = try_http(self.admin, "POST", "/admin", Some(&body))?;
        if r["janus"] != "success" {
            return Err(format!("{}: {r}", self.name));
        }
        Ok(r["response"].clone())
    }

    /// The handler's answer to an Admin API query_eventhandler request.
    fn admin(&self, request: Value) -> Value {
        self.try_admin(request)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", self.name, self.log_tail()))
    }

    fn owner_of(&self, room: Value) -> Value {
        let r = self.admin(json!({"request": "where", "room": room.clone()}));
        assert_eq!(r["room"], room, "{}: where echoes the room: {r}", self.name);
        r["owner"].clone()
    }

    fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL");
        let _ = child.wait();
    }

    /// SIGTERM; waits for the exit; returns the exit code.
    fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take().expect("running");
        procs::signal(child.id(), "TERM");
        let deadline = Instant::now() + LONG;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st.code();
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {LONG:?} of SIGTERM\n{}",
                self.name,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(80);
        format!(
            "---- {} log (last lines) ----\n{}",
            self.name,
            lines[from..].join("\n")
        )
    }
}

impl Drop for Janus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

/// One client of Janus's HTTP API: a session with one VideoRoom handle.
struct Client {
    port: u16,
    session: u64,
    handle: u64,
}

impl Client {
    fn open(j: &Janus, opaque_id: Option<&str>) -> Client {
        let r = j.api("/janus", json!({"janus": "create", "transaction": tx()}));
        assert_eq!(r["janus"], "success", "{r}");
        let session = r["data"]["id"].as_u64().expect("session id");
        let mut attach =
            json!({"janus": "attach", "plugin": "janus.plugin.videoroom", "transaction": tx()});
        if let Some(o) = opaque_id {
            attach["opaque_id"] = json!(o);
        }
        let r = j.api(&format!("/janus/{session}"), attach);
        assert_eq!(r["janus"], "success", "{r}");
        Client {
            port: j.http,
            session,
            handle: r["data"]["id"].as_u64().expect("handle id"),
        }
    }

    fn post(&self, path: &str, body: Value) -> Value {
        try_http(self.port, "POST", path, Some(&body)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn message(&self, body: Value) -> Value {
        self.post(
            &format!("/janus/{}/{}", self.session, self.handle),
            json!({"janus": "message", "body": body, "transaction": tx()}),
        )
    }

    /// A synchronous VideoRoom request (create, destroy, list, listparticipants, kick).
    fn request(&self, body: Value) -> Value {
        let r = self.message(body.clone());
        assert_eq!(r["janus"], "success", "{body} -> {r}");
        let data = r["plugindata"]["data"].clone();
        assert!(data.get("error").is_none(), "{body} -> {data}");
        data
    }

    /// An asynchronous request: acknowledged now, answered by an event of the session.
    fn send(&self, body: Value) -> Value {
        let r = self.message(body.clone());
        assert_eq!(r["janus"], "ack", "{body} -> {r}");
        self.event(&body.to_string(), |d| {
            d.get("error").is_some()
                || d["videoroom"] == "joined"
                || d["leaving"] == "ok"
                || d["unpublished"] == "ok"
        })
    }

    /// The next VideoRoom event of the session matching `pred` (long polls).
    fn event(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + LONG;
        loop {
            assert!(Instant::now() < deadline, "no event for {what}");
            let r = try_http(
                self.port,
                "GET",
                &format!("/janus/{}?maxev=10", self.session),
                None,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let events = match r {
                Value::Array(a) => a,
                one => vec![one],
            };
            for e in events {
                let data = &e["plugindata"]["data"];
                if e["sender"].as_u64() == Some(self.handle) && pred(data) {
                    assert!(data.get("error").is_none(), "{what} -> {data}");
                    return data.clone();
                }
            }
        }
    }

    /// Joins `room` as a publisher (no media); returns the participant id Janus gave.
    fn join(&self, room: &Value, display: &str) -> Value {
        let d = self.send(
            json!({"request": "join", "ptype": "publisher", "room": room, "display": display}),
        );
        assert_eq!(d["videoroom"], "joined", "{d}");
        d["id"].clone()
    }

    fn leave(&self) {
        let d = self.send(json!({"request": "leave"}));
        assert_eq!(d["leaving"], "ok", "{d}");
    }

    fn detach(&self) {
        let r = self.post(
            &format!("/janus/{}/{}", self.session, self.handle),
            json!({"janus": "detach", "transaction": tx()}),
        );
        assert_eq!(r["janus"], "success", "{r}");
    }

    fn destroy(&self) {
        let r = self.post(
            &format!("/janus/{}", self.session),
            json!({"janus": "destroy", "transaction": tx()}),
        );
        assert_eq!(r["janus"], "success", "{r}");
    }
}

/// A peer record's instance, guest and display name.
type Record = (String, Option<String>, Option<String>);

/// Rooms and participants, as Redis holds them or as Janus lists them (ids as the handler maps
/// them; empty collections left out, as Redis keeps no empty key).
#[derive(Debug, Default, PartialEq, Eq, Clone)]
struct View {
    /// room -> owning instance (the pin)
    owners: BTreeMap<String, String>,
    /// instance -> its room index
    instance_rooms: BTreeMap<String, BTreeSet<String>>,
    /// instance -> its room index as a reap moved it aside (`...:reaping-rooms`)
    reaping_rooms: BTreeMap<String, BTreeSet<String>>,
    /// room -> its peer set
    room_peers: BTreeMap<String, BTreeSet<String>>,
    /// (room, peer) -> the record
    records: BTreeMap<(String, String), Record>,
    /// instance -> the records naming it that its room index reaches, (room, peer): key schema
    /// version 2 keeps no peer index; an instance's records are found through its room index
    /// (live or moved aside), derived here from the records
    instance_peers: BTreeMap<String, BTreeSet<(String, String)>>,
    /// records that no index reaches: (instance, room, peer) of each record whose room is in
    /// neither its instance's room index nor its moved one (an orphan once it dies)
    unreached: BTreeSet<(String, String, String)>,
    /// room -> guest -> peer
    guests: BTreeMap<String, BTreeMap<String, String>>,
}

impl View {
    /// The part of the view that belongs to `instance`'s rooms.
    fn of(&self, instance: &str) -> View {
        let rooms: BTreeSet<&String> = self
            .owners
            .iter()
            .filter(|(_, o)| o.as_str() == instance)
            .map(|(r, _)| r)
            .collect();
        View {
            owners: self
                .owners
                .iter()
                .filter(|(r, _)| rooms.contains(r))
                .map(|(r, o)| (r.clone(), o.clone()))
                .collect(),
            instance_rooms: self
                .instance_rooms
                .iter()
                .filter(|(i, _)| i.as_str() == instance)
                .map(|(i, s)| (i.clone(), s.clone()))
                .collect(),
            reaping_rooms: self
                .reaping_rooms
                .iter()
                .filter(|(i, _)| i.as_str() == instance)
                .map(|(i, s)| (i.clone(), s.clone()))
                .collect(),
            room_peers: self
                .room_peers
                .iter()
                .filter(|(r, _)| rooms.contains(r))
                .map(|(r, s)| (r.clone(), s.clone()))
                .collect(),
            records: self
                .records
                .iter()
                .filter(|((r, _), _)| rooms.contains(r))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            instance_peers: self
                .instance_peers
                .iter()
                .filter(|(i, _)| i.as_str() == instance)
                .map(|(i, s)| (i.clone(), s.clone()))
                .collect(),
            unreached: self
                .unreached
                .iter()
                .filter(|(i, r, _)| i.as_str() == instance || rooms.contains(r))
                .cloned()
                .collect(),
            guests: self
                .guests
                .iter()
                .filter(|(r, _)| rooms.contains(r))
                .map(|(r, g)| (r.clone(), g.clone()))
                .collect(),
        }
    }
}

fn dec(wire: &str) -> String {
    decode_id(wire).unwrap_or_else(|e| panic!("{wire:?} is no wire id: {e}"))
}

fn redis_view(server: &Server, ks: &KeySpace) -> View {
    let mut v = View::default();
    let set = |val: &Val| -> BTreeSet<String> {
        match val {
            Val::Set(s) => s.iter().map(|m| dec(m)).collect(),
            other => panic!("not a set: {other:?}"),
        }
    };
    for (key, val) in server.dump(&ks.scan_pattern()) {
        match ks.parse(&key) {
            Some(ParsedKey::RoomOwner(r)) => {
                let Val::Str(o) = &val else {
                    panic!("{key}: {val:?}")
                };
                v.owners.insert(dec(&r), dec(o));
            }
            Some(ParsedKey::InstanceRooms(i)) => {
                v.instance_rooms.insert(dec(&i), set(&val));
            }
            Some(ParsedKey::InstanceReapingRooms(i)) => {
                v.reaping_rooms.insert(dec(&i), set(&val));
            }
            Some(ParsedKey::RoomPeers(r)) => {
                v.room_peers.insert(dec(&r), set(&val));
            }
            Some(ParsedKey::Peer(r, p)) => {
                let Val::Hash(h) = &val else {
                    panic!("{key}: {val:?}")
                };
                let guest = h.get("guest").filter(|g| !g.is_empty()).map(|g| dec(g));
                v.records.insert(
                    (dec(&r), dec(&p)),
                    (
                        dec(h.get("instance").expect("instance field")),
                        guest,
                        h.get("display").cloned(),
                    ),
                );
            }
            Some(ParsedKey::RoomGuests(r)) => {
                let Val::Hash(h) = &val else {
                    panic!("{key}: {val:?}")
                };
                v.guests
                    .insert(dec(&r), h.iter().map(|(g, p)| (dec(g), dec(p))).collect());
            }
            _ => {}
        }
    }
    // Each record reached through its instance's room index (live or moved aside), or not.
    let none = BTreeSet::new();
    for ((r, p), (i, ..)) in &v.records {
        let live = v.instance_rooms.get(i).unwrap_or(&none);
        let moved = v.reaping_rooms.get(i).unwrap_or(&none);
        if live.contains(r) || moved.contains(r) {
            v.instance_peers
                .entry(i.clone())
                .or_default()
                .insert((r.clone(), p.clone()));
        } else {
            v.unreached.insert((i.clone(), r.clone(), p.clone()));
        }
    }
    v
}

/// What Janus `j` (instance `instance`) lists, as the handler should have recorded it; rooms
/// in `held` (pinned by another instance) are left out. `guests` maps (room, participant) to
/// the opaque_id it joined with.
fn janus_view(
    j: &Janus,
    lister: &Client,
    held: &[&str],
    guests: &BTreeMap<(String, String), String>,
) -> View {
    let mut v = View::default();
    let list = lister.request(json!({"request": "list"}));
    for room in list["list"].as_array().expect("list") {
        let id = room["room"].clone();
        let r = id_str(&id);
        if held.contains(&r.as_str()) {
            continue;
        }
        v.owners.insert(r.clone(), j.name.to_owned());
        v.instance_rooms
            .entry(j.name.to_owned())
            .or_default()
            .insert(r.clone());
        let ps = lister.request(json!({"request": "listparticipants", "room": id}));
        for p in ps["participants"].as_array().expect("participants") {
            let pid = id_str(&p["id"]);
            let guest = guests.get(&(r.clone(), pid.clone())).cloned();
            let display = p["display"].as_str().map(str::to_owned);
            v.room_peers
                .entry(r.clone())
                .or_default()
                .insert(pid.clone());
            v.instance_peers
                .entry(j.name.to_owned())
                .or_default()
                .insert((r.clone(), pid.clone()));
            if let Some(g) = &guest {
                v.guests
                    .entry(r.clone())
                    .or_default()
                    .insert(g.clone(), pid.clone());
            }
            v.records
                .insert((r.clone(), pid), (j.name.to_owned(), guest, display));
        }
    }
    v
}

/// Polls until Janus lists `participants` participants in the rooms compared (a detach or a
/// session destroy completes in Janus after its reply) and Redis holds exactly what Janus
/// lists; panics with both views.
fn assert_redis_matches_janus(
    server: &Server,
    ks: &KeySpace,
    sides: &[(&Janus, &Client, &[&str])],
    guests: &BTreeMap<(String, String), String>,
    participants: usize,
) -> View {
    let deadline = Instant::now() + LONG;
    loop {
        let mut want = View::default();
        for (j, lister, held) in sides {
            let part = janus_view(j, lister, held, guests);
            want.owners.extend(part.owners);
            want.instance_rooms.extend(part.instance_rooms);
            want.room_peers.extend(part.room_peers);
            want.records.extend(part.records);
            want.instance_peers.extend(part.instance_peers);
            // Janus lists no moved room index and no record that no index reaches.
            want.guests.extend(part.guests);
        }
        let got = redis_view(server, ks);
        if got == want && want.records.len() == participants {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "Redis does not match Janus with {participants} participants after {LONG:?}\n\
             --- Janus lists\n{want:#?}\n--- Redis holds\n{got:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_fsck_clean(url: &str, when: &str) {
    let o = procs::cli_output("fsck", STAGE, url, &["--json", "--settle-ms", "500"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "fsck {when}: {text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: Value = serde_json::from_str(text.trim()).expect("fsck --json");
    assert_eq!(j["clean"], true, "fsck {when}: {j}");
}

/// Keys and values of the prefix that name `instance` or one of `rooms`.
fn leftovers(
    server: &Server,
    ks: &KeySpace,
    instance: &str,
    rooms: &BTreeSet<String>,
) -> Vec<String> {
    let dump = server.dump(&ks.scan_pattern());
    let mut found = support::references(&dump, &[instance.to_owned()]);
    for key in dump.keys() {
        if let Some(room) = ks.parse(key).as_ref().and_then(ParsedKey::room) {
            if rooms.contains(&dec(room)) {
                found.push(format!("{key}: a key of room {}", dec(room)));
            }
        }
    }
    found
}

/// A private redis-server with the ACL user the handlers log in as.
fn redis_with_user() -> Server {
    let server = Server::start_with(&[]);
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(REDIS_USER)
        .arg("on")
        .arg(format!(">{REDIS_PASSWORD}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query(&mut server.raw_con())
        .expect("ACL SETUSER");
    server
}

fn counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {stats}"))
}

#[test]
fn janus_videoroom_keeps_redis_in_step_across_a_crash_and_restarts() {
    let handler = handler();
    let started = Instant::now();
    let work = test_dir("crash");

    let server = redis_with_user();
    let url = format!(
        "redis://{REDIS_USER}:{REDIS_PASSWORD}@127.0.0.1:{}",
        server.redis().port()
    );
    let plain_url = server.url();
    let ks = KeySpace::new("sfu", STAGE, "main").unwrap();

    let mut ports = Vec::new();
    let mut a = Janus::configure(A, &work, handler, &url, false, "", &mut ports);
    let mut b = Janus::configure(B, &work, handler, &url, true, "", &mut ports);
    a.start();
    b.start();
    let la = Client::open(&a, None);
    let lb = Client::open(&b, None);

    // ---- 1. rooms, 20 participants, departures, a reconnect, a destroyed room ----------
    let a_rooms = [json!(1001), json!(1002), json!(1003)];
    let b_rooms = [json!("lobby"), json!("b room:2")];
    for room in &a_rooms {
        let d = la.request(
            json!({"request": "create", "room": room, "publishers": 30, "secret": ROOM_SECRET}),
        );
        assert_eq!(d["videoroom"], "created", "{d}");
    }
    for room in &b_rooms {
        let d = lb.request(
            json!({"request": "create", "room": room, "publishers": 30, "secret": ROOM_SECRET}),
        );
        assert_eq!(d["videoroom"], "created", "{d}");
    }
    // B creates a room that A holds already: logged and counted, its participant not recorded.
    wait_for(LONG, "room 1002 pinned by A", || {
        (a.owner_of(json!(1002)) == A).then_some(())
    });
    let d = lb.request(
        json!({"request": "create", "room": "1002", "publishers": 30, "secret": ROOM_SECRET}),
    );
    assert_eq!(d["videoroom"], "created", "{d}");
    // A room id the library refuses (over 256 bytes): logged and counted, Janus runs on.
    let long_room = "x".repeat(300);
    let d = lb.request(json!({"request": "create", "room": long_room, "publishers": 30}));
    assert_eq!(d["videoroom"], "created", "{d}");
    let b_not_recorded = ["1002", long_room.as_str()];

    // (janus, room, display, opaque_id)
    let plan: Vec<(&Janus, Value, String, Option<String>)> = [(1001, 4), (1002, 4), (1003, 3)]
        .iter()
        .flat_map(|&(room, n)| (0..n).map(move |k| (room, k)))
        .enumerate()
        .map(|(i, (room, k))| {
            let guest = (k < 2).then(|| format!("guest-a{i}"));
            (&a, json!(room), format!("Participant A{i}"), guest)
        })
        .chain(
            [("lobby", 5), ("b room:2", 3), ("1002", 1)]
                .iter()
                .flat_map(|&(room, n)| (0..n).map(move |k| (room, k)))
                .enumerate()
                .map(|(i, (room, k))| {
                    let guest = (k % 2 == 0).then(|| format!("guest-b{i}"));
                    (&b, json!(room), format!("Zoë B{i}"), guest)
                }),
        )
        .collect();
    assert_eq!(plan.len(), 20);
    let mut guests: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut people: Vec<(Client, String, Value)> = Vec::new(); // client, room, participant id
    for (j, room, display, guest) in &plan {
        let c = Client::open(j, guest.as_deref());
        let pid = c.join(room, display);
        if let Some(g) = guest {
            guests.insert((id_str(room), id_str(&pid)), g.clone());
        }
        people.push((c, id_str(room), pid));
    }
    let find = |room: &str, n: usize| -> usize {
        people
            .iter()
            .enumerate()
            .filter(|(_, p)| p.1 == room)
            .nth(n)
            .map(|(i, _)| i)
            .expect("a participant of the room")
    };
    // Departures: a leave, a kick, a handle detach, a session destroyed.
    people[find("1001", 3)].0.leave();
    let kicked = people[find("1002", 3)].2.clone();
    let d =
        la.request(json!({"request": "kick", "room": 1002, "secret": ROOM_SECRET, "id": kicked}));
    assert_eq!(d["videoroom"], "success", "{d}");
    people[find("lobby", 4)].0.detach();
    people[find("lobby", 3)].0.destroy();

    // A reconnect: guest-a0 joins 1001 again from a new session while its old one lingers.
    // Its new record replaces the old one at once; Janus drops the old participant only when
    // its session goes.
    let old = find("1001", 0);
    let (old_pid, guest) = (id_str(&people[old].2), "guest-a0".to_owned());
    assert_eq!(
        guests.get(&("1001".to_owned(), old_pid.clone())),
        Some(&guest)
    );
    let again = Client::open(&a, Some(&guest));
    let new_pid = id_str(&again.join(&json!(1001), "Participant A0 again"));
    guests.insert(("1001".to_owned(), new_pid.clone()), guest.clone());
    wait_for(LONG, "the reconnect's record replacing the old one", || {
        let v = redis_view(&server, &ks);
        let pointer = v.guests.get("1001").and_then(|g| g.get(&guest));
        (pointer == Some(&new_pid)
            && v.records
                .contains_key(&("1001".to_owned(), new_pid.clone()))
            && !v
                .records
                .contains_key(&("1001".to_owned(), old_pid.clone())))
        .then_some(())
    });
    people[old].0.destroy();
    guests.remove(&("1001".to_owned(), old_pid.clone()));

    // One room destroyed with its participants inside.
    let d = la.request(json!({"request": "destroy", "room": 1003, "secret": ROOM_SECRET}));
    assert_eq!(d["videoroom"], "destroyed", "{d}");

    // 20 joins + 1 rejoin - leave, kick, detach, destroyed session, replaced old record, the
    // 3 of the destroyed room, the one in the held room.
    let view = assert_redis_matches_janus(
        &server,
        &ks,
        &[(&a, &la, &[]), (&b, &lb, &b_not_recorded)],
        &guests,
        20 + 1 - 4 - 1 - 3 - 1,
    );
    let rooms_of = |i: &str| -> BTreeSet<String> {
        view.owners
            .iter()
            .filter(|(_, o)| o.as_str() == i)
            .map(|(r, _)| r.clone())
            .collect()
    };
    assert_eq!(
        rooms_of(A),
        BTreeSet::from(["1001".to_owned(), "1002".to_owned()])
    );
    assert_eq!(
        rooms_of(B),
        BTreeSet::from(["lobby".to_owned(), "b room:2".to_owned()])
    );
    let recorded = view.records.len();
    println!("after the first half: {recorded} participants in Redis match Janus's lists");

    // The Admin API: where (numbers and strings, across instances) and stats.
    assert_eq!(a.owner_of(json!(1001)), A);
    assert_eq!(b.owner_of(json!(1001)), A);
    assert_eq!(b.owner_of(json!("1002")), A);
    assert_eq!(a.owner_of(json!("b room:2")), B);
    assert_eq!(a.owner_of(json!(1003)), Value::Null);
    let bad = a.admin(json!({"request": "where", "room": [1]}));
    assert_eq!(bad["error_code"], 413, "{bad}");
    let unknown = a.admin(json!({"request": "shutdown"}));
    assert_eq!(unknown["error_code"], 411, "{unknown}");
    let sa = a.admin(json!({"request": "stats"}));
    let sb = b.admin(json!({"request": "stats"}));
    for (s, name) in [(&sa, A), (&sb, B)] {
        assert_eq!(s["instance"], name, "{s}");
        assert_eq!(s["node"]["instance_id"], name, "{s}");
        assert_eq!(s["queue"]["depth"], 0, "{s}");
        for c in ["dropped", "bad_events"] {
            assert_eq!(counter(s, c), 0, "{name} {c}: {s}");
        }
    }
    assert_eq!(counter(&sa, "failed"), 0, "{sa}");
    assert_eq!(counter(&sb, "failed"), 1, "the long room id: {sb}");
    assert!(
        b.log_text().contains(&format!(
            "created room={long_room} not recorded: SFU_ERR_INVALID_ID"
        )),
        "{}",
        b.log_tail()
    );
    assert_eq!(counter(&sa, "replaced"), 1, "{sa}");
    assert_eq!(sa["node"]["rooms"], 2, "{sa}");
    assert!(counter(&sb, "rooms_held") >= 1, "{sb}");
    assert_eq!(counter(&sb, "joins_not_recorded"), 1, "{sb}");
    assert_fsck_clean(&plain_url, "after the first half");
    let first_half = started.elapsed();

    // ---- 2. kill -9 of A: B reaps what A held -------------------------------------------
    let b_before = view.of(B);
    let a_rooms_now = rooms_of(A);
    let t = Timings::fast();
    let bound =
        t.stale_threshold.max(t.lease_ttl + t.lease_refresh) + t.reap_interval + t.two_phase_delay;
    let kill_wall = wall_ms();
    let killed = Instant::now();
    a.kill9();
    let gone = wait_for(
        LONG + LONG,
        "A's rooms, participants and registration reaped",
        || {
            leftovers(&server, &ks, A, &a_rooms_now)
                .is_empty()
                .then(|| killed.elapsed())
        },
    );
    println!(
        "kill -9 {A} -> last key of {A} gone: {} ms (documented bound with fast timings: {} ms \
         = max(stale_threshold, lease_ttl + lease_refresh) + reap_interval + two_phase_delay, \
         plus the reap)",
        gone.as_millis(),
        bound.as_millis()
    );
    for line in b.log_text().lines() {
        let Some(j) = line.split_once("[sfuredis] event ").map(|(_, j)| j) else {
            continue;
        };
        let Ok(e) = serde_json::from_str::<Value>(j) else {
            continue;
        };
        if let Some(ts) = e["ts_ms"].as_i64().filter(|ts| *ts >= kill_wall) {
            println!("  {B} +{:>5} ms: {}", ts - kill_wall, e);
        }
    }
    assert!(
        gone < bound + Duration::from_secs(20),
        "reaped after {gone:?}, the bound is {bound:?} (+20 s for a loaded machine)"
    );
    let after = redis_view(&server, &ks);
    assert_eq!(
        after.of(B),
        b_before,
        "B's rooms and participants untouched"
    );
    assert_eq!(after.owners.len(), b_before.owners.len(), "{after:#?}");
    for room in [json!(1001), json!("1002")] {
        assert_eq!(b.owner_of(room.clone()), Value::Null, "where {room} on B");
    }
    let sb = b.admin(json!({"request": "stats"}));
    assert!(sb["node"]["instances_reaped"].as_u64() >= Some(1), "{sb}");
    assert_fsck_clean(&plain_url, "after the reap of A");
    let reaped = started.elapsed();

    // ---- 3. A again, with the same instance id: a clean start ---------------------------
    a.start();
    let sa = a.admin(json!({"request": "stats"}));
    assert_eq!(sa["node"]["rooms"], 0, "{sa}");
    assert_eq!(sa["node"]["peers"], 0, "{sa}");
    let v = redis_view(&server, &ks);
    assert!(
        v.of(A).owners.is_empty() && !v.instance_rooms.contains_key(A),
        "{v:#?}"
    );
    assert!(
        !v.instance_peers.contains_key(A)
            && !v.reaping_rooms.contains_key(A)
            && v.unreached.is_empty(),
        "{v:#?}"
    );
    assert_eq!(v.of(B), b_before, "B untouched by A's restart");
    let la = Client::open(&a, None);
    let d = la.request(json!({"request": "create", "room": 1001, "publishers": 30}));
    assert_eq!(d["videoroom"], "created", "{d}");
    let back = Client::open(&a, Some("guest-a0"));
    let back_pid = id_str(&back.join(&json!(1001), "Back again"));
    guests.insert(("1001".to_owned(), back_pid), "guest-a0".to_owned());
    // A's one participant; B's 5 + 3 less the detached and the destroyed.
    assert_redis_matches_janus(
        &server,
        &ks,
        &[(&a, &la, &[]), (&b, &lb, &b_not_recorded)],
        &guests,
        1 + 5 + 3 - 2,
    );
    assert_fsck_clean(&plain_url, "after A's restart");

    // A killed again and started again at once, before any reap: its registration waits for
    // the dead life's heartbeat to expire, and whatever that life left is gone once it is
    // registered (cleared by the registration, or by B's reaper if it came first).
    let v = redis_view(&server, &ks);
    assert_eq!(v.owners.get("1001").map(String::as_str), Some(A), "{v:#?}");
    assert_eq!(
        v.room_peers.get("1001").map(BTreeSet::len),
        Some(1),
        "{v:#?}"
    );
    a.kill9();
    let again = Instant::now();
    a.start();
    println!(
        "{A} killed and started again at once: registered after {} ms",
        again.elapsed().as_millis()
    );
    let v = redis_view(&server, &ks);
    assert!(
        !v.owners.contains_key("1001")
            && !v.room_peers.contains_key("1001")
            && !v.records.keys().any(|(r, _)| r == "1001")
            && !v.instance_rooms.contains_key(A)
            && !v.reaping_rooms.contains_key(A)
            && !v.instance_peers.contains_key(A)
            && v.unreached.is_empty(),
        "the earlier life's keys are left: {v:#?}"
    );
    assert_eq!(v.of(B), b_before, "B untouched by A's second restart");
    assert_fsck_clean(&plain_url, "after A's second restart");

    // ---- 4. SIGTERM of B: its leave removes what it held; then of A ---------------------
    let b_rooms_now: BTreeSet<String> = b_before.owners.keys().cloned().collect();
    let a_view = redis_view(&server, &ks).of(A);
    let code = b.terminate();
    assert_eq!(code, Some(0), "{}", b.log_tail());
    let left = leftovers(&server, &ks, B, &b_rooms_now);
    assert!(left.is_empty(), "left behind by B's leave: {left:#?}");
    assert_eq!(
        redis_view(&server, &ks).of(A),
        a_view,
        "A untouched by B's leave"
    );
    assert_fsck_clean(&plain_url, "after B's leave");
    let code = a.terminate();
    assert_eq!(code, Some(0), "{}", a.log_tail());
    let all: BTreeSet<String> = b_rooms_now.union(&a_rooms_now).cloned().collect();
    let left = leftovers(&server, &ks, A, &all);
    assert!(left.is_empty(), "left behind by A's leave: {left:#?}");
    assert_eq!(redis_view(&server, &ks), View::default());

    // Neither Janus log shows the Redis password; both show the handler at work.
    for j in [&a, &b] {
        let log = j.log_text();
        assert!(
            !log.contains(REDIS_PASSWORD),
            "{}'s log shows the Redis password",
            j.name
        );
        assert!(
            log.contains(&format!("[sfuredis] registered as instance {}", j.name)),
            "{}",
            j.log_tail()
        );
        assert!(
            log.contains("[sfuredis] left: every room"),
            "{}",
            j.log_tail()
        );
    }
    println!(
        "timeline from the start of the scenario: first half done {:?}, A reaped {:?}, end {:?}",
        first_half,
        reaped,
        started.elapsed()
    );
}

/// Janus starts while Redis is unreachable: it runs, the handler queues VideoRoom's events
/// and retries its registration; once Redis answers it registers and applies the queue in
/// order. Then an outage while participants join: the queue (capacity 4) holds what fits,
/// drops the rest (counted, logged), and applies what it held once Redis is back. Janus
/// answers throughout.
#[test]
fn janus_runs_through_redis_outages_and_the_queue_catches_up() {
    let handler = handler();
    let work = test_dir("outage");
    let server = redis_with_user();
    let proxy = server.proxy();
    proxy.refuse_new(true);
    let url = format!("redis://{REDIS_USER}:{REDIS_PASSWORD}@{}", proxy.addr());
    let ks = KeySpace::new("sfu", STAGE, "main").unwrap();
    let mut ports = Vec::new();
    let mut c = Janus::configure(
        "janus-c",
        &work,
        handler,
        &url,
        false,
        "  queue_capacity = 4\n",
        &mut ports,
    );

    // Redis unreachable at start.
    c.launch();
    let s = wait_for(LONG, "a failed registration", || {
        let s = c.admin(json!({"request": "stats"}));
        (counter(&s, "start_failures") >= 1).then_some(s)
    });
    assert_eq!(s["registered"], false, "{s}");
    assert_eq!(s["node"], Value::Null, "{s}");
    let w = c.admin(json!({"request": "where", "room": 7}));
    assert_eq!(w["error_code"], 503, "{w}");
    let lc = Client::open(&c, None);
    let d = lc.request(json!({"request": "create", "room": 7, "publishers": 30}));
    assert_eq!(d["videoroom"], "created", "{d}");
    let mut guests = BTreeMap::new();
    let mut people = Vec::new();
    for k in 0..2 {
        let guest = format!("guest-c{k}");
        let p = Client::open(&c, Some(&guest));
        let pid = id_str(&p.join(&json!(7), &format!("Early {k}")));
        guests.insert(("7".to_owned(), pid), guest);
        people.push(p);
    }
    let s = c.admin(json!({"request": "stats"}));
    assert_eq!(s["queue"]["depth"], 3, "created + 2 joined wait: {s}");
    assert_eq!(counter(&s, "dropped"), 0, "{s}");
    assert!(
        server.keys(&ks.scan_pattern()).is_empty(),
        "nothing written yet"
    );

    // Redis reachable: registered, the queue applied.
    proxy.heal();
    c.wait_registered();
    assert_redis_matches_janus(&server, &ks, &[(&c, &lc, &[])], &guests, 2);

    // An outage while six participants join: four fit in the queue, two are dropped.
    proxy.blackhole(Direction::Both);
    let mut late = Vec::new();
    for k in 0..6 {
        let p = Client::open(&c, None);
        late.push(id_str(&p.join(&json!(7), &format!("Late {k}"))));
        people.push(p);
    }
    let s = wait_for(LONG, "the outage counted", || {
        let s = c.admin(json!({"request": "stats"}));
        (counter(&s, "redis_retries") >= 1).then_some(s)
    });
    assert_eq!(s["queue"]["depth"], 4, "{s}");
    assert_eq!(counter(&s, "dropped"), 2, "{s}");
    proxy.heal();
    let deadline = Instant::now() + LONG;
    loop {
        let mut want = janus_view(&c, &lc, &[], &guests);
        for dropped in &late[4..] {
            want.records.remove(&("7".to_owned(), dropped.clone()));
            for set in want.room_peers.values_mut() {
                set.remove(dropped);
            }
            for set in want.instance_peers.values_mut() {
                set.remove(&("7".to_owned(), dropped.clone()));
            }
        }
        let got = redis_view(&server, &ks);
        if got == want && want.records.len() == 2 + 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the outage\n--- want\n{want:#?}\n--- got\n{got:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = c.admin(json!({"request": "stats"}));
    assert_eq!(s["queue"]["depth"], 0, "{s}");
    assert_eq!(counter(&s, "handled"), 1 + 2 + 4, "{s}");
    assert_eq!(counter(&s, "failed"), 0, "{s}");
    let log = c.log_text();
    assert!(
        log.contains("queue full (4 events waiting for Redis): dropped joined room=7"),
        "{}",
        c.log_tail()
    );
    assert!(log.contains("Redis answers again"), "{}", c.log_tail());
    assert_fsck_clean(&server.url(), "after the outages");

    assert_eq!(c.terminate(), Some(0), "{}", c.log_tail());
    assert_eq!(redis_view(&server, &ks), View::default());

    // Killed, then started again at once with the same id: registration waits for the dead
    // life's heartbeat (4 s TTL here) to expire, and the log says so while it waits.
    let conf = c.dir.join("conf").join(format!("{HANDLER}.jcfg"));
    let text = fs::read_to_string(&conf).unwrap();
    assert!(text.contains("timings = \"fast\""), "{text}");
    c.set_handler_config(&text.replace(
        "timings = \"fast\"",
        "timings = \"from_heartbeat:500,4000\"",
    ));
    c.launch();
    c.wait_registered();
    let hb = ks.heartbeat("janus-c");
    assert_eq!(
        server.keys(&hb),
        vec![hb.clone()],
        "the first life heartbeats"
    );
    c.kill9();
    let killed = Instant::now();
    let before = c.log_text().matches("still registering").count();
    c.launch();
    c.wait_registered();
    let took = killed.elapsed();
    let log = c.log_text();
    assert!(
        log.matches("still registering with Redis after 1 s: most likely a process with the same instance_id")
            .count()
            > before,
        "no line while registration waited {took:?}: {}",
        c.log_tail()
    );
    assert_eq!(c.terminate(), Some(0), "{}", c.log_tail());
    assert_eq!(redis_view(&server, &ks), View::default());
    assert!(
        !c.log_text().contains(REDIS_PASSWORD),
        "the log shows the Redis password"
    );
}

/// A configuration the handler refuses disables it with a reason naming the key; Janus runs
/// on and the Admin API says why. A password in a refused URL reaches no log.
#[test]
fn a_bad_configuration_disables_the_handler_and_janus_runs_on() {
    let handler = handler();
    let work = test_dir("config");
    let mut ports = Vec::new();
    let mut d = Janus::configure(
        "janus-d",
        &work,
        handler,
        "redis://127.0.0.1:1",
        false,
        "",
        &mut ports,
    );
    let secret = "Bad-Url-Secret";
    let cases = [
        (
            "general: {\n  enabled = true\n  redis_urll = \"redis://127.0.0.1:6379\"\n}\n".to_owned(),
            "redis_urll",
        ),
        (
            format!("general: {{\n  enabled = true\n  redis_url = \"redis://u:{secret}@127.0.0.1:notaport\"\n}}\n"),
            "redis_url",
        ),
        (
            "general: {\n  enabled = true\n  timings = \"from_heartbeat:500,100\"\n}\n".to_owned(),
            "heartbeat",
        ),
        (
            "general: {\n  enabled = true\n  queue_capacity = 0\n}\n".to_owned(),
            "queue_capacity",
        ),
        ("sfuredis: {\n  enabled = true\n}\n".to_owned(), "sfuredis"),
    ];
    for (text, key) in cases {
        d.set_handler_config(&text);
        d.launch();
        let s = d.admin(json!({"request": "stats"}));
        assert_eq!(s["error_code"], 503, "{text}: {s}");
        let why = s["error"].as_str().unwrap_or_default();
        assert!(
            why.contains("disabled by a configuration error") && why.contains(key),
            "{text}: {why}"
        );
        // Janus itself works.
        let c = Client::open(&d, None);
        let r = c.request(json!({"request": "list"}));
        assert_eq!(r["videoroom"], "success", "{r}");
        assert_eq!(d.terminate(), Some(0), "{}", d.log_tail());
        println!("refused: {why}");
    }
    let log = d.log_text();
    assert!(
        !log.contains(secret),
        "a log shows the URL's password:\n{log}"
    );
    // Disabled explicitly: said so, no error.
    d.set_handler_config(
        "general: {\n  enabled = false\n  redis_url = \"redis://127.0.0.1:1\"\n}\n",
    );
    d.launch();
    let s = d.admin(json!({"request": "stats"}));
    assert!(
        s["error"]
            .as_str()
            .unwrap_or_default()
            .contains("disabled (enabled = true is not set"),
        "{s}"
    );
    assert_eq!(d.terminate(), Some(0), "{}", d.log_tail());
}

/// The handler's event mapping on Janus's shapes and on malformed ones
/// (`integrations/janus/tests/events_test.cpp`, built with the handler), under valgrind
/// memcheck when it is installed (required in CI).
#[test]
fn the_event_mapping_takes_janus_shapes_and_reports_bad_ones() {
    handler();
    let exe = work_dir().join("build/sfuredis_events_test");
    let run = ffi_support::run(&exe, &[], true, &[]);
    assert!(run.output.status.success(), "{}", run.describe());
    assert!(run.stdout().contains(", 0 failed"), "{}", run.describe());
    ffi_support::assert_memcheck_clean("sfuredis_events_test", &run);
    print!("{}", run.stdout());
}

/// Load through Janus (issue 28 item 4): a benchmark, not a test of timings (`#[ignore]`d; run
/// it with `cargo test -p sfu-redis-capi --test janus -- --ignored --nocapture janus_load`).
/// Two Janus processes and one private `redis-server`, as above; `JANUS_LOAD_ROOMS` rooms
/// (default 50, half on each Janus); `JANUS_LOAD_PARTICIPANTS` participants (default 1,000,
/// spread over the rooms) join through the HTTP API from `JANUS_LOAD_THREADS` client threads
/// (default 16, each driving one participant at a time: session, attach, join), then leave
/// (half with VideoRoom's `leave`, half by detaching the handle; then the session is
/// destroyed). Prints, for each Janus, the events its handler handled per second (its `stats`),
/// the queue's maximum depth, the worker's busy and CPU time; the time from a leave in Janus
/// (the HTTP reply to the leave or to the detach) to the peer record's `del` (keyspace
/// notifications of the private redis-server): p50, p99, max, overall, by way of leaving and by
/// Janus; the CPU time of each process. Asserts only that every join and leave reached Redis,
/// nothing dropped or failed. The figures: integrations/janus/README.md, "Load benchmark".
#[test]
#[ignore = "a benchmark: cargo test -p sfu-redis-capi --test janus -- --ignored --nocapture janus_load"]
fn janus_load_joins_and_leaves_participants_across_rooms_on_both_instances() {
    let setting = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .map(|v| v.parse().unwrap_or_else(|e| panic!("{name}={v}: {e}")))
            .unwrap_or(default)
    };
    let (n, rooms_n, threads) = (
        setting("JANUS_LOAD_PARTICIPANTS", 1000),
        setting("JANUS_LOAD_ROOMS", 50),
        setting("JANUS_LOAD_THREADS", 16),
    );
    let handler = handler();
    let work = test_dir("load");
    let server = redis_with_user();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Kg")
        .query(&mut server.raw_con())
        .expect("CONFIG SET notify-keyspace-events");
    let url = format!(
        "redis://{REDIS_USER}:{REDIS_PASSWORD}@127.0.0.1:{}",
        server.redis().port()
    );
    let ks = KeySpace::new("sfu", STAGE, "main").unwrap();
    let mut ports = Vec::new();
    let mut a = Janus::configure(A, &work, handler, &url, false, "", &mut ports);
    let mut b = Janus::configure(B, &work, handler, &url, true, "", &mut ports);
    a.start();
    b.start();
    let (la, lb) = (Client::open(&a, None), Client::open(&b, None));
    // Room k on A (numeric ids) when k is even, on B (string ids) when odd.
    let rooms: Vec<(&Janus, Value)> = (0..rooms_n)
        .map(|k| match k % 2 {
            0 => (&a, json!(5000 + k)),
            _ => (&b, json!(format!("load-{k}"))),
        })
        .collect();
    for (j, room) in &rooms {
        let lister = if j.name == A { &la } else { &lb };
        let d = lister
            .request(json!({"request": "create", "room": room, "publishers": n / rooms_n + 1}));
        assert_eq!(d["videoroom"], "created", "{d}");
    }
    wait_for(LONG, "every room pinned", || {
        (server.keys(&format!("{}:room:*:owner", ks.prefix())).len() == rooms_n).then_some(())
    });

    // The peer records' deletions, stamped as they arrive.
    let (gone_tx, gone_rx) = std::sync::mpsc::channel::<(String, Instant)>();
    let mut sub = server.raw_con();
    let pattern = format!("__keyspace@0__:{}:room:*:peer:*", ks.prefix());
    std::thread::spawn(move || {
        let mut ps = sub.as_pubsub();
        ps.psubscribe(&pattern).expect("PSUBSCRIBE");
        let _ = gone_tx.send((String::new(), Instant::now()));
        // Ends when the server stops or the test is done with the channel.
        while let Ok(m) = ps.get_message() {
            let at = Instant::now();
            if m.get_payload::<String>().is_ok_and(|p| p == "del") {
                let key = m.get_channel_name().trim_start_matches("__keyspace@0__:");
                if gone_tx.send((key.to_owned(), at)).is_err() {
                    return;
                }
            }
        }
    });
    gone_rx.recv_timeout(LONG).expect("keyspace subscription");

    // The time, both handlers' stats, the CPU time of both Janus, redis-server, this client and
    // the handlers' workers.
    let snapshot = || -> (Instant, [Value; 2], [Duration; 6]) {
        let at = Instant::now();
        let stats = [&a, &b].map(|j| j.admin(json!({"request": "stats"})));
        let janus = [&a, &b].map(|j| j.child.as_ref().unwrap().id());
        let pids = [
            janus[0],
            janus[1],
            server.redis().pid().expect("redis-server's pid"),
            std::process::id(),
        ];
        let [c0, c1, c2, c3] = pids.map(|p| cpu_time(&format!("/proc/{p}")));
        let [w0, w1] = janus.map(|p| worker_cpu(p, "sfuredis-worker"));
        (at, stats, [c0, c1, c2, c3, w0, w1])
    };
    // Waits until both handlers' queues are empty and `done` holds; the time it first held.
    let drained = |done: &dyn Fn() -> bool| -> Instant {
        wait_for(LONG, "the handlers drained", || {
            let at = Instant::now();
            let s = [&a, &b].map(|j| j.admin(json!({"request": "stats"})));
            (s.iter().all(|s| s["queue"]["depth"] == 0) && done()).then_some(at)
        })
    };

    println!(
        "janus load: {n} participants in {rooms_n} rooms ({} on {A}, {} on {B}), {threads} client threads",
        rooms_n.div_ceil(2),
        rooms_n / 2
    );
    let start = snapshot();
    let joined = fan_out(n, threads, |i| {
        let (j, room) = &rooms[i % rooms_n];
        let c = Client::open(j, Some(&format!("load-guest-{i}")));
        let pid = id_str(&c.join(room, &format!("Load {i}")));
        (c, id_str(room), pid)
    });
    let joins_sent = start.0.elapsed();
    let peers = || server.keys(&format!("{}:room:*:peer:*", ks.prefix())).len();
    let joins_done = drained(&|| peers() == n);
    let mid = snapshot();

    // Participants 0 and 1 leave (one on each Janus when the rooms alternate), 2 and 3 detach.
    let leaves = |i: usize| i % 4 < 2;
    let left = fan_out(n, threads, |i| {
        let (c, room, pid) = &joined[i];
        // The HTTP reply: to a leave, Janus's ack (VideoRoom's `leaving` event follows).
        let at = if leaves(i) {
            let r = c.message(json!({"request": "leave"}));
            assert_eq!(r["janus"], "ack", "{r}");
            let at = Instant::now();
            c.event("leave", |d| d["leaving"] == "ok");
            at
        } else {
            c.detach();
            Instant::now()
        };
        c.destroy();
        ((room.clone(), pid.clone()), at)
    });
    let leaves_sent = mid.0.elapsed();
    let mut gone: BTreeMap<(String, String), Instant> = BTreeMap::new();
    let deadline = Instant::now() + LONG;
    while gone.len() < n {
        let wait = deadline.saturating_duration_since(Instant::now());
        let (key, at) = gone_rx.recv_timeout(wait).unwrap_or_else(|_| {
            panic!("{} of {n} peer records deleted after {LONG:?}", gone.len())
        });
        if let Some(ParsedKey::Peer(r, p)) = ks.parse(&key) {
            gone.insert((dec(&r), dec(&p)), at);
        }
    }
    let leaves_done = drained(&|| true);
    let end = snapshot();
    assert_eq!(peers(), 0);

    // Leave -> record gone, in ms (negative: gone before the client had Janus's reply).
    let lat: Vec<f64> = left
        .iter()
        .map(|(key, at)| {
            let g = gone[key];
            1e3 * if g >= *at {
                (g - *at).as_secs_f64()
            } else {
                -(*at - g).as_secs_f64()
            }
        })
        .collect();
    let rate = |count: usize, d: Duration| count as f64 / d.as_secs_f64();
    println!(
        "joins: {n} in {:.1} s through the HTTP API ({:.0}/s); Redis had them all {} ms after the last reply",
        joins_sent.as_secs_f64(),
        rate(n, joins_sent),
        joins_done.duration_since(start.0 + joins_sent).as_millis()
    );
    println!(
        "leaves: {n} in {:.1} s ({:.0}/s); the last record gone {} ms after the last reply",
        leaves_sent.as_secs_f64(),
        rate(n, leaves_sent),
        gone.values()
            .max()
            .unwrap()
            .saturating_duration_since(mid.0 + leaves_sent)
            .as_millis()
    );
    let wall = leaves_done - start.0;
    for (k, name) in [A, B].into_iter().enumerate() {
        let (s0, s1, s2) = (&start.1[k], &mid.1[k], &end.1[k]);
        let delta = |s: &Value, t: &Value, c: &str| counter(t, c) - counter(s, c);
        let handled = delta(s0, s2, "handled");
        let busy = Duration::from_micros(delta(s0, s2, "busy_us"));
        println!(
            "handler {name}: {handled} events handled in {:.1} s: {:.0}/s ({:.0}/s while joining, \
             {:.0}/s while leaving); worker busy {:.2} s ({:.0} events/s of its time; its CPU \
             {:.2} s), mean wait in the queue {:.2} ms, queue max depth {}; dropped {}, failed {}",
            wall.as_secs_f64(),
            rate(handled as usize, wall),
            rate(delta(s0, s1, "handled") as usize, joins_done - start.0),
            rate(delta(s1, s2, "handled") as usize, leaves_done - mid.0),
            busy.as_secs_f64(),
            rate(handled as usize, busy),
            (end.2[4 + k] - start.2[4 + k]).as_secs_f64(),
            delta(s0, s2, "queue_wait_us") as f64 / 1e3 / handled.max(1) as f64,
            s2["queue"]["max_depth"],
            counter(s2, "dropped"),
            counter(s2, "failed"),
        );
        for c in ["dropped", "failed", "bad_events"] {
            assert_eq!(counter(s2, c), 0, "{name} {c}: {s2}");
        }
    }
    let on_a = |i: usize| rooms[i % rooms_n].0.name == A;
    let groups: [(String, &dyn Fn(usize) -> bool); 5] = [
        ("all".into(), &|_| true),
        ("leave request".into(), &leaves),
        ("detach".into(), &|i| !leaves(i)),
        (format!("on {A}"), &on_a),
        (format!("on {B}"), &|i| !on_a(i)),
    ];
    for (what, pick) in groups {
        let v: Vec<f64> = (0..n).filter(|&i| pick(i)).map(|i| lat[i]).collect();
        let (p50, p99, max) = (quantile(&v, 0.5), quantile(&v, 0.99), quantile(&v, 1.0));
        println!(
            "leave in Janus -> peer record gone in Redis ({what}, {} samples): p50 {p50:.1} ms, \
             p99 {p99:.1} ms, max {max:.1} ms",
            v.len()
        );
    }
    let cpu: Vec<String> = ["janus-a", "janus-b", "redis-server", "the client"]
        .iter()
        .enumerate()
        .map(|(k, who)| format!("{who} {:.1} s", (end.2[k] - start.2[k]).as_secs_f64()))
        .collect();
    println!(
        "CPU over the {:.1} s of load: {} (2 cores: {:.1} s available)",
        wall.as_secs_f64(),
        cpu.join(", "),
        2.0 * wall.as_secs_f64()
    );
}

/// Runs `f(0)` .. `f(n - 1)` on `threads` threads, each taking the next item; the results in
/// item order.
fn fan_out<T: Send>(n: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let mut out: Vec<(usize, T)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return mine;
                        }
                        mine.push((i, f(i)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a client thread panicked"))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, t)| t).collect()
}

/// The `q` quantile of `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize]
}

/// The CPU time (user + system) of `/proc/<pid>` or `/proc/<pid>/task/<tid>` (in USER_HZ = 100
/// ticks a second).
fn cpu_time(proc_dir: &str) -> Duration {
    let stat = fs::read_to_string(format!("{proc_dir}/stat")).expect("/proc/.../stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("(comm)")
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// The CPU time of process `pid`'s threads named `name`.
fn worker_cpu(pid: u32, name: &str) -> Duration {
    fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc/<pid>/task")
        .filter_map(|t| {
            let dir = t.ok()?.path().display().to_string();
            let comm = fs::read_to_string(format!("{dir}/comm")).ok()?;
            (comm.trim() == name).then(|| cpu_time(&dir))
        })
        .sum()
}

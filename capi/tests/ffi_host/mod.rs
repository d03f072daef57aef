//! A C++ host process (`capi/examples/cpp/sfu_host.cpp`, however it was built) driven from a
//! test: its stdout lines arrive on a channel and are kept for the failure message, its events
//! are parsed from the `event <json>` lines, its exit is awaited with a deadline.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::LONG;

/// A running host process; its stdout lines arrive on a channel, its stderr is kept.
pub struct Host {
    pub name: String,
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
}

impl Host {
    /// Starts `exe args`; `name` labels its transcript.
    pub fn spawn(exe: &Path, name: &str, args: &[&str]) -> Host {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sfu_host");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = err.read_to_string(&mut buf);
            sink.lock().unwrap().push_str(&buf);
        });
        Host {
            name: name.to_owned(),
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    pub fn transcript(&self) -> String {
        format!(
            "--- {} stdout\n{}\n--- {} stderr\n{}",
            self.name,
            self.seen.join("\n"),
            self.name,
            self.stderr.lock().unwrap()
        )
    }

    /// The first line (from now on) that satisfies `pred`, within `timeout`.
    pub fn line(&mut self, timeout: Duration, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if pred(&l) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "{}: no {what} within {timeout:?}\n{}",
                    self.name,
                    self.transcript()
                ),
            }
        }
    }

    /// The next event named `name` whose JSON satisfies `pred`.
    pub fn event(&mut self, name: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let line = self.line(LONG, &format!("event {name}"), |l| {
            l.strip_prefix("event ")
                .and_then(|j| serde_json::from_str::<Value>(j).ok())
                .is_some_and(|v| v["event"] == name && pred(&v))
        });
        serde_json::from_str(line.strip_prefix("event ").unwrap()).unwrap()
    }

    /// Waits for the process to exit (within `timeout`) and returns its exit code.
    pub fn exit_code(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                // Collect what is left of stdout.
                while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(l);
                }
                return st.code();
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}\n{}",
                self.name,
                self.transcript()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

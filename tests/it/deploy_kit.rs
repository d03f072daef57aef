//! The operator kit (`deploy/`, issue 30 item 4) against a real node: a `sfu-redis node
//! --metrics-addr` process is scraped over HTTP as Prometheus scrapes it (OpenMetrics), and
//! every metric name the alert rules, their promtool tests, the Grafana dashboard and
//! `deploy/README.md` use must be a series that scrape holds; every metric family the node
//! exports must be watched by a rule or a panel (or be in [`UNWATCHED`] with a reason). Also:
//! each alert has a firing and a non-firing promtool test, `for:`, a severity and a runbook
//! annotation; the systemd unit and its environment file use only flags and variables that
//! `sfu-redis node --help` lists. (`promtool check rules` / `test rules` run in `.ci/run`.)

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::procs::{cli_bin, MetricsNode};
use support::*;

const RULES: &str = "deploy/prometheus/sfu-redis.rules.yml";
const RULES_TEST: &str = "deploy/prometheus/sfu-redis.rules.test.yml";
const DASHBOARD: &str = "deploy/grafana/sfu-redis.json";
const README: &str = "deploy/README.md";
const UNIT: &str = "deploy/systemd/sfu-redis-node.service";
const UNIT_ENV: &str = "deploy/systemd/sfu-redis-node.env.example";

/// Metric families the node exports that neither a rule nor a panel uses, each with the
/// reason. Empty: every family is watched. An entry that is not exported, or that is used
/// after all, fails the test (the list cannot go stale).
const UNWATCHED: &[(&str, &str)] = &[];

/// The suffixes a family's samples carry (counters `_total`; histograms `_bucket`, `_sum`,
/// `_count`; OpenMetrics also `_created`, which this exposition does not write).
const SUFFIXES: [&str; 4] = ["_total", "_bucket", "_sum", "_count"];

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every `sfu_redis_[a-z_]+` token of `text` (not inside a longer word, such as
/// `libsfu_redis_x`).
fn metric_tokens(text: &str) -> BTreeSet<String> {
    const STEM: &str = "sfu_redis_";
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(STEM).map(|i| from + i) {
        let glued = text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        let end = at
            + STEM.len()
            + text[at + STEM.len()..]
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(text.len() - at - STEM.len());
        if !glued && end > at + STEM.len() {
            out.insert(text[at..end].trim_end_matches('_').to_owned());
        }
        from = end.max(at + 1);
    }
    out
}

/// The `expr:` values of a rules file: plain scalars and block scalars (`|`, `>`), whose
/// lines are those indented deeper than the `expr:` key.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let indent = lines[i].len() - trimmed.len();
        i += 1;
        let Some(rest) = trimmed
            .strip_prefix("expr:")
            .or_else(|| trimmed.strip_prefix("- expr:"))
        else {
            continue;
        };
        let rest = rest.trim();
        if rest.starts_with('|') || rest.starts_with('>') {
            let mut body = String::new();
            while i < lines.len() {
                let t = lines[i].trim_start();
                if !t.is_empty() && lines[i].len() - t.len() <= indent {
                    break;
                }
                body.push_str(t);
                body.push('\n');
                i += 1;
            }
            out.push(body);
        } else {
            out.push(rest.trim_matches(|c| c == '\'' || c == '"').to_owned());
        }
    }
    out
}

/// The PromQL of a dashboard: every string under a key `expr`, `query` or `definition`
/// (panel targets and template variables), anywhere in the JSON.
fn dashboard_queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match v {
                    Value::String(s) if matches!(k.as_str(), "expr" | "query" | "definition") => {
                        out.push(s.clone())
                    }
                    _ => dashboard_queries(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

/// A scrape: the metric families (`# TYPE` lines) and the sample names.
#[derive(Debug, Default)]
struct Exposition {
    families: BTreeMap<String, String>,
    samples: BTreeSet<String>,
}

fn exposition(text: &str) -> Exposition {
    let mut e = Exposition::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("# TYPE <name> <type>");
            e.families.insert(name.to_owned(), ty.to_owned());
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            e.samples.insert(line[..end].to_owned());
        }
    }
    e
}

/// What the kit gets wrong against a scrape, one line each (empty: nothing).
/// `sources`: (file, PromQL of its rules or panels); `texts`: (file, any text naming metrics).
fn problems(
    scrape: &Exposition,
    sources: &[(&str, Vec<String>)],
    texts: &[(&str, String)],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for (file, exprs) in sources {
        for expr in exprs {
            for t in metric_tokens(expr) {
                if !scrape.samples.contains(&t) {
                    out.push(format!(
                        "{file}: the query `{}` uses {t}, which the node does not export",
                        expr.split_whitespace().collect::<Vec<_>>().join(" ")
                    ));
                }
                used.insert(t);
            }
        }
    }
    for (file, text) in texts {
        for t in metric_tokens(text) {
            if !scrape.samples.contains(&t) {
                out.push(format!("{file} names {t}, which the node does not export"));
            }
        }
    }
    let watched = |family: &str| {
        used.contains(family)
            || SUFFIXES
                .iter()
                .any(|s| used.contains(&format!("{family}{s}")))
    };
    for family in scrape.families.keys() {
        let allowed = UNWATCHED.iter().any(|(n, _)| n == family);
        match (watched(family), allowed) {
            (false, false) => out.push(format!(
                "the node exports {family} ({}), which no rule and no panel uses: watch it, or add it to UNWATCHED with the reason",
                scrape.families[family]
            )),
            (true, true) => out.push(format!(
                "{family} is in UNWATCHED but a rule or a panel uses it: remove it from the list"
            )),
            _ => {}
        }
    }
    for (name, _) in UNWATCHED {
        if !scrape.families.contains_key(*name) {
            out.push(format!(
                "UNWATCHED names {name}, which the node does not export"
            ));
        }
    }
    out
}

/// One `GET /metrics` with `accept` as the `Accept` header: the body.
fn scrape(addr: SocketAddr, accept: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connect to the metrics server at {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header end");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

fn metrics_node(url: &str) -> MetricsNode {
    let extra = ["--rooms", "kit-r1,kit-r2", "--peers-per-room", "2"];
    support::procs::spawn_metrics_node(url, "kit", "kit-a", &extra, None)
}

// The check: the rules and the dashboard name only what a real node exports, and
// watch everything it exports.
#[test]
fn the_kit_uses_only_exported_metrics_and_watches_every_family() {
    let server = Server::start_with(&[]);
    let node = metrics_node(&server.url());
    // Prometheus asks for OpenMetrics (counters `_total`, `# UNIT`, `# EOF`); a scraper that
    // does not gets the 0.0.4 text format, with the same sample names.
    let openmetrics = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let text = wait_for(LONG, "a scrape of a leader", || {
        let t = scrape(node.addr, openmetrics);
        t.contains("\nsfu_redis_is_leader 1\n").then_some(t)
    });
    assert!(text.ends_with("# EOF\n"), "OpenMetrics: {text}");
    let om = exposition(&text);
    let plain = exposition(&scrape(node.addr, "text/plain"));
    assert_eq!(
        om.samples, plain.samples,
        "both formats expose the same sample names"
    );
    assert!(
        om.families.len() >= 25 && om.samples.contains("sfu_redis_heartbeats_total"),
        "a real exposition: {om:?}"
    );

    let rules = read(RULES);
    let exprs = rule_exprs(&rules);
    let alerts: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|a| a.trim().to_owned())
        .collect();
    assert_eq!(
        exprs.len(),
        alerts.len(),
        "one expr per alert: {exprs:#?} / {alerts:?}"
    );
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut panels = Vec::new();
    dashboard_queries(&dashboard, &mut panels);
    assert!(panels.len() > 10, "the dashboard's queries: {panels:?}");

    let found = problems(
        &om,
        &[(RULES, exprs), (DASHBOARD, panels)],
        &[
            (RULES, rules.clone()),
            (RULES_TEST, read(RULES_TEST)),
            (README, read(README)),
        ],
    );
    assert!(
        found.is_empty(),
        "the operator kit against a real scrape:\n{}\n(exported: {:?})",
        found.join("\n"),
        om.samples
    );
}

// The check itself can fail: a rule naming a metric the node does not export, an exported
// family nobody watches, and an allow-list entry for nothing are each named.
#[test]
fn the_check_names_a_missing_metric_and_an_unwatched_family() {
    let scrape = exposition(
        "# TYPE sfu_redis_reaps counter\nsfu_redis_reaps_total 0\n\
         # TYPE sfu_redis_rooms gauge\nsfu_redis_rooms 2\n\
         # TYPE sfu_redis_tick_duration_seconds histogram\n\
         sfu_redis_tick_duration_seconds_bucket{le=\"+Inf\"} 0\n\
         sfu_redis_tick_duration_seconds_sum 0\nsfu_redis_tick_duration_seconds_count 0\n# EOF\n",
    );
    let rules = "groups:\n  - rules:\n      - alert: X\n        expr: |\n          \
                 increase(sfu_redis_reap_failures_total[5m]) > 0\n          \
                 or rate(sfu_redis_reaps_total[5m]) > 1\n        for: 1m\n      \
                 - alert: Y\n        expr: histogram_quantile(0.9, sfu_redis_tick_duration_seconds_bucket) > 1\n";
    let exprs = rule_exprs(rules);
    assert_eq!(exprs.len(), 2, "{exprs:?}");
    let found = problems(&scrape, &[("rules", exprs)], &[]);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].contains("uses sfu_redis_reap_failures_total, which the node does not export"),
        "{found:?}"
    );
    assert!(
        found[1].contains("exports sfu_redis_rooms (gauge), which no rule and no panel uses"),
        "{found:?}"
    );
    // Tokens: whole names only, suffixes kept, nothing glued to a longer word.
    assert_eq!(
        metric_tokens("libsfu_redis_x sum(sfu_redis_is_leader{a=\"1\"}) sfu_redis_ x:sfu_redis_y"),
        BTreeSet::from(["sfu_redis_is_leader".to_owned()])
    );
}

// Each alert: `for:`, a severity, a summary and a description naming a runbook command; one
// promtool test case where it fires and one where it must not.
#[test]
fn every_alert_has_a_runbook_and_a_firing_and_a_quiet_promtool_test() {
    let rules = read(RULES);
    let tests = read(RULES_TEST);
    let blocks: Vec<&str> = rules.split("- alert:").skip(1).collect();
    assert!(blocks.len() >= 10, "{} alerts", blocks.len());
    let test_lines: Vec<&str> = tests.lines().collect();
    for block in blocks {
        let name = block.split_whitespace().next().expect("an alert name");
        for field in ["expr:", "for:", "severity:", "summary:", "description:"] {
            assert!(block.contains(field), "alert {name} has no {field}");
        }
        assert!(
            block.contains("severity: critical") || block.contains("severity: warning"),
            "alert {name}: severity critical or warning"
        );
        let description = block.split("description:").nth(1).expect("a description");
        assert!(
            description.contains("Runbook:") && description.contains("`sfu-redis "),
            "alert {name}: the description names a runbook step with an sfu-redis command"
        );
        // Each `alertname: X` line of the tests is followed by its `exp_alerts:` line.
        let (mut fires, mut quiet) = (0, 0);
        for (i, line) in test_lines.iter().enumerate() {
            if line.trim() != format!("alertname: {name}") {
                continue;
            }
            let exp = test_lines[i + 1..]
                .iter()
                .find(|l| l.trim_start().starts_with("exp_alerts:"))
                .expect("exp_alerts after alertname");
            if exp.trim() == "exp_alerts: []" {
                quiet += 1;
            } else {
                fires += 1;
            }
        }
        assert!(
            fires >= 1 && quiet >= 1,
            "alert {name}: {fires} promtool case(s) where it fires, {quiet} where it must not (want 1 and 1)"
        );
    }
}

// The systemd unit and its environment file: every flag of ExecStart and every variable they
// set is one `sfu-redis node --help` lists (RUST_LOG: the logger's own).
#[test]
fn the_systemd_unit_uses_real_flags_and_variables() {
    let help = Command::new(cli_bin())
        .args(["node", "--help"])
        .output()
        .expect("run sfu-redis node --help");
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let env_vars: BTreeSet<String> = help
        .split("[env: ")
        .skip(1)
        .filter_map(|s| s.split([']', '=']).next())
        .map(str::to_owned)
        .chain(["RUST_LOG".to_owned()])
        .collect();
    assert!(env_vars.contains("REDIS_URL"), "{env_vars:?}");

    let unit = read(UNIT);
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart=");
    let mut words = exec.split_whitespace();
    assert!(words.next().is_some_and(|b| b.ends_with("/sfu-redis")));
    assert_eq!(words.next(), Some("node"), "{exec}");
    for flag in words {
        assert!(
            flag.starts_with("--") && help.contains(&format!("{flag} ")),
            "ExecStart flag {flag} is not one of `sfu-redis node --help`"
        );
    }
    assert!(
        !exec.contains("redis://") && !exec.contains("--redis-url"),
        "the Redis URL (and its password) comes from the EnvironmentFile, not the command line"
    );
    for line in [
        "EnvironmentFile=/etc/sfu-redis/node.env",
        "KillSignal=SIGTERM",
        "Restart=on-failure",
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "MemoryDenyWriteExecute=yes",
        "SystemCallFilter=@system-service",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit has {line}");
    }
    let env_file = read(UNIT_ENV);
    let set = unit
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .chain(env_file.lines().map(|l| l.trim_start_matches('#')))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_owned()))
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_'));
    let mut seen = 0;
    for var in set {
        seen += 1;
        assert!(
            env_vars.contains(&var),
            "{var} (unit or {UNIT_ENV}) is not a variable of `sfu-redis node --help`: {env_vars:?}"
        );
    }
    assert!(seen >= 5, "{seen} variables");
}

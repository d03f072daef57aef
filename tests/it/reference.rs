//! The reference pages against the built `sfu-redis` binary, both ways (issue 30, item 3):
//!
//! - `cli.md` lists every flag (and its environment variable) of every subcommand's `--help`,
//!   and no flag a `--help` lacks;
//! - the flags and environment variables of `configuration.md` are those of
//!   `sfu-redis node --help`, and every variable a `--help` names is on that page;
//! - `events.md` names every line a real `sfu-redis node --json` process prints, the CLI's own
//!   (`churn_summary`) included.
//!
//! What needs no binary (the library's settings, environment variables and event names, the C
//! event kinds) is in `tests/docs.rs`; the metrics are checked on a scrape in `metrics.rs`, the
//! C keys by `capi`'s unit tests, the CLI's setting-to-flag map by `cli`'s. No Redis: `--help`
//! and a memory-only node; a few seconds in all.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::pages::{self, report, Page, Section};
use crate::support::procs::{cli_bin, output_text, signal};

const CLI: &str = "docs/src/reference/cli.md";
const EVENTS: &str = "docs/src/reference/events.md";

/// The flags of `sfu-redis node` that set nothing of the node's `Config` (what it does at
/// start, how it prints, what it serves), so they are in `cli.md` only, not in
/// `configuration.md`'s Settings table.
const NODE_RUN_FLAGS: [&str; 5] = [
    "--rooms",
    "--peers-per-room",
    "--json",
    "--leave-on-exit",
    "--metrics-addr",
];

/// One flag of a `--help`: its names (`-h`, `--help`) and the environment variable it reads.
#[derive(Debug, Default)]
struct HelpFlag {
    names: Vec<String>,
    env: Option<String>,
}

/// What a `--help` lists.
#[derive(Debug, Default)]
struct Help {
    flags: Vec<HelpFlag>,
    commands: Vec<String>,
}

impl Help {
    fn names(&self) -> BTreeSet<&str> {
        self.flags
            .iter()
            .flat_map(|f| f.names.iter().map(String::as_str))
            .collect()
    }

    fn env_of(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .find(|f| f.names.iter().any(|n| n == name))
            .and_then(|f| f.env.as_deref())
    }
}

/// `sfu-redis <args> --help`, run with an empty environment (a variable that is set shows its
/// value in the help), parsed.
fn help(args: &[&str]) -> Help {
    let out = Command::new(cli_bin())
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .expect("run sfu-redis --help");
    assert!(
        out.status.success(),
        "sfu-redis {} --help: {}",
        args.join(" "),
        output_text(&out)
    );
    parse_help(&String::from_utf8_lossy(&out.stdout))
}

/// clap's help in either layout: a flag line (`  -h, --help`, `      --stage <NAME>  ...`)
/// indented less than its description lines, the description after it on the same line or
/// on the next ones, `[env: NAME]` or `[env: NAME=value]` among them; subcommands as
/// `  name  about` lines under `Commands:`.
fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut heading = "";
    for line in text.lines() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if indent == 0 {
            if !t.is_empty() {
                heading = t;
            }
            continue;
        }
        match heading {
            "Commands:" if indent <= 2 => {
                if let Some(name) = t.split_whitespace().next() {
                    help.commands.push(name.to_owned());
                }
            }
            "Options:" => {
                if indent < 8 && t.starts_with('-') {
                    let names = t
                        .split_whitespace()
                        .take_while(|w| w.starts_with('-'))
                        .map(|w| w.trim_end_matches(',').to_owned())
                        .collect();
                    help.flags.push(HelpFlag { names, env: None });
                }
                if let (Some(flag), Some(at)) = (help.flags.last_mut(), t.find("[env: ")) {
                    let rest = &t[at + "[env: ".len()..];
                    let end = rest.find(['=', ']']).unwrap_or(rest.len());
                    flag.env = Some(rest[..end].to_owned());
                }
            }
            _ => {}
        }
    }
    help
}

/// A flag as a reference page lists it: the environment variables its rows name, and where.
#[derive(Debug, Default)]
struct DocFlag {
    env: BTreeSet<String>,
    lines: Vec<usize>,
}

impl DocFlag {
    /// Its lines in the page, for messages: `74` or `74,80`.
    fn at(&self) -> String {
        let lines: Vec<String> = self.lines.iter().map(usize::to_string).collect();
        lines.join(",")
    }
}

/// The flags the tables of `sections` list in their `flag` column, with the environment
/// variables of their rows (in the `environment` column or beside the flag).
fn doc_flags(sections: &[&Section]) -> BTreeMap<String, DocFlag> {
    let mut out: BTreeMap<String, DocFlag> = BTreeMap::new();
    for section in sections {
        for table in &section.tables {
            let Some(flag_col) = table.column("flag") else {
                continue;
            };
            let env_col = table.column("environment");
            for row in &table.rows {
                let cell = table.cell(row, flag_col);
                let mut env = pages::env_vars_in(cell);
                if let Some(c) = env_col {
                    env.extend(pages::env_vars_in(table.cell(row, c)));
                }
                for flag in pages::flags_in(cell) {
                    let entry = out.entry(flag).or_default();
                    entry.env.extend(env.iter().cloned());
                    entry.lines.push(row.line);
                }
            }
        }
    }
    out
}

/// What differs between the flags `command --help` lists and those `cli.md` lists for it
/// (`place` says where the page lists them), each way, environment variables included.
fn compare(
    command: &str,
    help: &Help,
    doc: &BTreeMap<String, DocFlag>,
    place: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    for flag in &help.flags {
        for name in &flag.names {
            let Some(d) = doc.get(name) else {
                problems.push(format!(
                    "`{command} --help` has {name}, which {CLI} does not list {place}"
                ));
                continue;
            };
            let want: BTreeSet<String> = flag.env.iter().cloned().collect();
            if name.starts_with("--") && d.env != want {
                problems.push(format!(
                    "{CLI}:{}: {name} of `{command}` reads {}, says `{command} --help`; the page's row names {}",
                    d.at(),
                    describe(&want),
                    describe(&d.env)
                ));
            }
        }
    }
    let names = help.names();
    for (name, d) in doc {
        if !names.contains(name.as_str()) {
            problems.push(format!(
                "{CLI}:{} lists {name} {place}, but `{command} --help` has no such flag",
                d.at()
            ));
        }
    }
    problems
}

fn describe(env: &BTreeSet<String>) -> String {
    if env.is_empty() {
        "no environment variable".into()
    } else {
        env.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

/// The subcommands `sfu-redis --help` lists, but clap's own `help` (which prints the others'
/// help and has no flags of its own).
fn subcommands(top: &Help) -> Vec<String> {
    top.commands
        .iter()
        .filter(|c| *c != "help")
        .cloned()
        .collect()
}

/// `cli.md` against every `--help`, both ways: a `## sfu-redis <sub>` section per subcommand
/// `sfu-redis --help` lists and none other; each subcommand's flags (its section's tables, the
/// sections it links to in the page, and `## Global flags`) exactly those of its `--help`,
/// each with the environment variable its `--help` gives it; `sfu-redis --help`'s own flags
/// exactly the global ones; and no table of flags that applies to no subcommand.
#[test]
fn cli_reference_lists_every_flag_of_every_subcommand_and_no_other() {
    let page = Page::reference("cli.md");
    let top = help(&[]);
    let subs = subcommands(&top);
    assert!(
        subs.len() >= 7 && subs.iter().any(|s| s == "node"),
        "the subcommands of `sfu-redis --help` were not read: {top:#?}"
    );
    let mut problems = Vec::new();
    let global = page.section("Global flags").unwrap_or_else(|| {
        panic!("{CLI}: no `## Global flags` section (the flags of `sfu-redis --help` itself)")
    });
    problems.extend(compare(
        "sfu-redis",
        &top,
        &doc_flags(&[global]),
        "under `## Global flags`",
    ));

    let documented: BTreeMap<&str, &Section> = page
        .sections
        .iter()
        .filter_map(|s| Some((s.title.strip_prefix("sfu-redis ")?, s)))
        .collect();
    for (sub, s) in &documented {
        if !subs.iter().any(|x| x == sub) {
            problems.push(format!(
                "{CLI}:{}: a section for `sfu-redis {sub}`, a subcommand `sfu-redis --help` does not list ({subs:?})",
                s.line
            ));
        }
    }
    let mut applied: BTreeSet<&str> = BTreeSet::from([global.anchor.as_str()]);
    for sub in &subs {
        let Some(section) = documented.get(sub.as_str()) else {
            problems.push(format!(
                "`sfu-redis --help` lists the subcommand {sub}, which {CLI} has no `## sfu-redis {sub}` section for"
            ));
            continue;
        };
        applied.insert(&section.anchor);
        let mut sections = vec![*section, global];
        for anchor in section.in_page_links() {
            match page.by_anchor(&anchor) {
                Some(s) => {
                    applied.insert(&s.anchor);
                    sections.push(s);
                }
                None => problems.push(format!(
                    "{CLI}:{}: `## sfu-redis {sub}` links to #{anchor}, which is no heading of the page",
                    section.line
                )),
            }
        }
        let place = format!(
            "under `## sfu-redis {sub}`, in a section it links to, or under `## Global flags`"
        );
        problems.extend(compare(
            &format!("sfu-redis {sub}"),
            &help(&[sub]),
            &doc_flags(&sections),
            &place,
        ));
    }
    for s in &page.sections {
        if !applied.contains(s.anchor.as_str()) && !doc_flags(&[s]).is_empty() {
            problems.push(format!(
                "{CLI}:{}: `{}` lists flags no subcommand takes: link it from the sections of the subcommands that do",
                s.line, s.title
            ));
        }
    }
    report(
        &problems,
        &format!("fix {CLI}, or the flag in cli/src/ if the code is wrong"),
    );
}

/// `configuration.md` against `sfu-redis node --help`, both ways: each flag of its Settings
/// table is a flag of `sfu-redis node`, and the row's environment variables are exactly those
/// its flags read; each flag of `sfu-redis node` is in that table unless it is a run option
/// ([`NODE_RUN_FLAGS`]) or a global flag; and every environment variable of any subcommand's
/// `--help` is on the page (Settings table or "Environment variables").
#[test]
fn configuration_reference_flags_and_environment_variables_are_the_clis() {
    let page = Page::reference("configuration.md");
    let rows = pages::setting_rows(&page);
    let top = help(&[]);
    let node = help(&["node"]);
    let node_names = node.names();
    let global = top.names();
    let mut problems = Vec::new();
    let mut table_flags = BTreeSet::new();
    for row in &rows {
        let mut read = BTreeSet::new();
        for flag in &row.flags {
            table_flags.insert(flag.as_str());
            if !node_names.contains(flag.as_str()) {
                problems.push(format!(
                    "{}:{}: the Settings table names {flag}, which `sfu-redis node --help` does not have",
                    pages::CONFIGURATION,
                    row.line
                ));
            }
            read.extend(node.env_of(flag).map(str::to_owned));
        }
        let named: BTreeSet<String> = row.env_vars.iter().cloned().collect();
        if !row.flags.is_empty() && named != read {
            problems.push(format!(
                "{}:{}: the row's flags {:?} read {} (`sfu-redis node --help`); the row names {}",
                pages::CONFIGURATION,
                row.line,
                row.flags,
                describe(&read),
                describe(&named)
            ));
        }
    }
    for name in &node_names {
        let run = NODE_RUN_FLAGS.contains(name);
        if name.starts_with("--") && !global.contains(name) && !run && !table_flags.contains(name) {
            problems.push(format!(
                "`sfu-redis node --help` has {name}, which the Settings table of {} does not name: add it there, or to NODE_RUN_FLAGS in tests/it/reference.rs if it sets nothing of the node's Config",
                pages::CONFIGURATION
            ));
        }
    }
    for flag in NODE_RUN_FLAGS {
        if !node_names.contains(flag) {
            problems.push(format!(
                "NODE_RUN_FLAGS (tests/it/reference.rs) names {flag}, which `sfu-redis node --help` does not have"
            ));
        }
        if table_flags.contains(flag) {
            problems.push(format!(
                "{flag} is in NODE_RUN_FLAGS (tests/it/reference.rs) and in the Settings table of {}: it is one or the other",
                pages::CONFIGURATION
            ));
        }
    }

    let mut on_page: BTreeSet<String> = rows.iter().flat_map(|r| r.env_vars.clone()).collect();
    let others = page
        .section("Environment variables")
        .and_then(|s| s.table_with("variable"))
        .unwrap_or_else(|| {
            panic!(
                "{}: no table of variables under `## Environment variables`",
                pages::CONFIGURATION
            )
        });
    for row in &others.rows {
        on_page.extend(pages::env_vars_in(others.cell(row, 0)));
    }
    for sub in subcommands(&top) {
        for flag in help(&[&sub]).flags {
            if let Some(env) = flag.env.filter(|e| !on_page.contains(e)) {
                problems.push(format!(
                    "`sfu-redis {sub} --help`: {} reads {env}, which {} names neither in its Settings table nor under `## Environment variables`",
                    flag.names.join(", "),
                    pages::CONFIGURATION
                ));
            }
        }
    }
    report(
        &problems,
        &format!(
            "fix {}, or the flag in cli/src/ if the code is wrong",
            pages::CONFIGURATION
        ),
    );
}

/// `events.md` names every line a real `sfu-redis node --json` process prints, and each line
/// it documents as the CLI's own (its `## Lines of the CLI` table) is one the process printed.
/// The node runs memory-only with the chaos test's churn (the hidden `--churn-*` flags), so it
/// prints the library's `ready` and `stopped` and the CLI's `churn_summary`. The library's
/// events (`Event::NAMES`) are checked against the page in `tests/docs.rs`.
#[test]
fn events_reference_names_every_line_a_node_process_prints() {
    let mut child = Command::new(cli_bin())
        .args(["node", "--json", "--instance-id", "ref-events"])
        .args(["--churn-rooms", "ref-r1,ref-r2", "--churn-for-ms", "200"])
        .args(["--churn-seed", "30"])
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sfu-redis node");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut printed = BTreeSet::new();
    let mut lines = Vec::new();
    let mut signalled = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            break;
        };
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("a stdout line of `node --json` is not JSON ({e}): {line}"));
        let name = v["event"]
            .as_str()
            .unwrap_or_else(|| panic!("a line without \"event\": {line}"))
            .to_owned();
        // The churn's last summary: stop the node, which then prints `stopped`.
        if name == "churn_summary" && v["done"] == true && !signalled {
            signal(child.id(), "TERM");
            signalled = true;
        }
        printed.insert(name);
        lines.push(line);
    }
    let _ = child.kill();
    let status = child.wait().expect("wait for the node");
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert!(
        signalled && status.success() && printed.contains("ready") && printed.contains("stopped"),
        "the node did not run its churn and stop cleanly ({status:?}); stdout:\n{}\nstderr:\n{stderr}",
        lines.join("\n")
    );

    let page = Page::reference("events.md");
    let library = event_names(&page, "The events", "event");
    let cli = event_names(&page, "Lines of the CLI", "line");
    let mut problems = Vec::new();
    for name in &printed {
        if !library.contains_key(name) && !cli.contains_key(name) {
            problems.push(format!(
                "`sfu-redis node --json` printed a `{name}` line, which {EVENTS} does not name (an event of the library goes under `## The events`, a line of the CLI's own under `## Lines of the CLI`)"
            ));
        }
    }
    for (name, line) in &cli {
        if sfu_redis::Event::NAMES.contains(&name.as_str()) {
            problems.push(format!(
                "{EVENTS}:{line}: `{name}` is an event of the library (`Event::NAMES`), not a line of the CLI's own: move it under `## The events`"
            ));
        } else if !printed.contains(name) {
            problems.push(format!(
                "{EVENTS}:{line}: `{name}` is documented as a line of the CLI, but the node printed none (it printed {printed:?})"
            ));
        }
    }
    report(
        &problems,
        &format!("fix {EVENTS}, or the line in cli/src/ if the code is wrong"),
    );
}

/// The names in the first column (`column`) of the table under `## <title>` of `events.md`,
/// with their lines.
fn event_names(page: &Page, title: &str, column: &str) -> BTreeMap<String, usize> {
    let table = page
        .section(title)
        .and_then(|s| s.table_with(column))
        .unwrap_or_else(|| {
            panic!("{EVENTS}: no table with a column {column:?} under `## {title}`")
        });
    let col = table.column(column).expect("the column");
    table
        .rows
        .iter()
        .flat_map(|row| {
            pages::code_spans(table.cell(row, col))
                .into_iter()
                .map(move |name| (name, row.line))
        })
        .collect()
}

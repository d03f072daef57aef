//! The docs hold together (issue 30): every relative link of `README.md`, `docs/**/*.md` and
//! `deploy/README.md` resolves to a file or directory of the repository, and every `#anchor`
//! into a Markdown file to one of its headings, by GitHub's slug rules (which mdBook's match for
//! the headings we write). Every page under `docs/src/` is listed in `docs/src/SUMMARY.md`, so
//! `mdbook build docs` renders it; every page with a `rust` example is compiled as a doctest
//! (`src/lib.rs`, `mod book_doctests`). The README stays a front page of at most 200 lines,
//! with the quick start's two commands exactly as `.ci/run` and operators use them.
//!
//! The reference pages against the library's own lists, both ways (issue 30, item 3): the
//! settings of `configuration.md` are the fields of a `ConfigBuilder`, its environment
//! variables `sfu_redis::config::ENV_VARS`; the events of `events.md` are `Event::NAMES`, with
//! their Rust variants and C kinds (`capi/include/sfu_redis.h`). What needs the `sfu-redis`
//! binary is in `tests/it/reference.rs`.
//!
//! Pure file checks and the library's lists: no Redis, no process. Its own binary, so
//! `cargo test --test docs` runs in seconds. The checkers are tested on small inputs of their
//! own too, so a checker that finds nothing cannot pass unnoticed.

#[path = "it/support/pages.rs"]
mod pages;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

use pages::{Page, CONFIGURATION};
use sfu_redis::config::ENV_VARS;
use sfu_redis::Event;

/// The README's line budget (issue 30, item 1).
const README_MAX_LINES: usize = 200;

/// The quick start's commands, byte for byte: `.ci/run` runs the second, operators the first.
const QUICK_START: [&str; 2] = [
    "cargo run --release -- demo   # the main job: a 3-node cluster demo on a real Redis",
    "cargo test                    # the tests (each starts its own private redis-server)",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One link as written: the file it is in, its line, and its target.
#[derive(Debug, Clone)]
struct Link {
    file: PathBuf,
    line: usize,
    target: String,
}

/// The lines of a Markdown text outside fenced code blocks, with inline code spans blanked,
/// each with its 1-based number.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    pages::outside_fences(text)
        .into_iter()
        .map(|(n, line)| (n, blank_code_spans(line)))
        .collect()
}

use pages::blank_code_spans;

/// Every inline link and image target of `text` (`[text](target)`, `![alt](target)`) and every
/// reference definition (`[label]: target`), outside code.
fn links(file: &Path, text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (number, line) in prose_lines(text) {
        let t = line.trim_start();
        if t.starts_with('[') {
            if let Some(end) = t.find("]:") {
                let target = t[end + 2..].split_whitespace().next().unwrap_or("");
                if !target.is_empty() && !t[..end].contains('(') {
                    out.push(Link {
                        file: file.to_path_buf(),
                        line: number,
                        target: target.trim_matches(['<', '>']).to_owned(),
                    });
                    continue;
                }
            }
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let mut depth = 0usize;
            let mut end = after.len();
            for (k, c) in after.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = k;
                        break;
                    }
                    ')' => depth -= 1,
                    _ => {}
                }
            }
            let inside = after[..end].trim();
            let target = inside.split_whitespace().next().unwrap_or("");
            out.push(Link {
                file: file.to_path_buf(),
                line: number,
                target: target.trim_matches(['<', '>']).to_owned(),
            });
            rest = &after[end.min(after.len())..];
        }
    }
    out
}

/// The anchors GitHub gives the headings of a Markdown text: the heading's text as rendered,
/// lower-cased, with everything but letters, marks, digits, `_`, `-` and spaces dropped and
/// each space made a `-`; a repeated slug gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fence: Option<char> = None;
    for line in text.lines() {
        let t = line.trim_start();
        for c in ['`', '~'] {
            if t.starts_with(&c.to_string().repeat(3)) {
                fence = match fence {
                    None => Some(c),
                    Some(f) if f == c => None,
                    other => other,
                };
            }
        }
        if fence.is_some() || line.starts_with(' ') {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let slug = slug(&rendered(title));
        let n = seen.entry(slug.clone()).or_insert(0);
        let anchor = if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        };
        *n += 1;
        out.insert(anchor);
    }
    out
}

/// A heading's text as GitHub renders it: code spans keep their text, link texts stay and
/// their targets go, emphasis marks go.
fn rendered(title: &str) -> String {
    let mut s = String::new();
    let mut rest = title;
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](") {
            Some(mid) => {
                let close = rest[open + mid..].find(')').map(|c| open + mid + c);
                s.push_str(&rest[..open]);
                s.push_str(&rest[open + 1..open + mid]);
                rest = close.map_or("", |c| &rest[c + 1..]);
            }
            None => {
                s.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    s.push_str(rest);
    s.replace(['`', '*'], "")
}

use pages::slug;

/// `path` with `.` and `..` resolved lexically (the files need not exist); `None` when a `..`
/// climbs above the start, out of the repository.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:") || target.starts_with("tel:")
}

/// What is wrong with each relative link of `files` (paths relative to `base`): a missing
/// file, a link out of the repository, or an anchor no heading of the target has.
fn broken_links(base: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    for file in files {
        let text = fs::read_to_string(base.join(file))
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        for link in links(file, &text) {
            if link.target.is_empty() || is_external(&link.target) {
                if link.target.is_empty() {
                    problems.push(format!(
                        "{}:{}: an empty link target",
                        link.file.display(),
                        link.line
                    ));
                }
                continue;
            }
            let (path, anchor) = match link.target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (link.target.as_str(), None),
            };
            let path = path.replace("%20", " ");
            let where_ = format!("{}:{}: `{}`", link.file.display(), link.line, link.target);
            let resolved = if path.is_empty() {
                Some(file.clone())
            } else if let Some(abs) = path.strip_prefix('/') {
                normalize(Path::new(abs))
            } else {
                normalize(&file.parent().unwrap_or(Path::new("")).join(&path))
            };
            let Some(resolved) = resolved.filter(|r| !r.as_os_str().is_empty()) else {
                problems.push(format!("{where_} leaves the repository"));
                continue;
            };
            if !base.join(&resolved).exists() {
                problems.push(format!("{where_}: no file {}", resolved.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if resolved.extension().is_some_and(|e| e == "md") {
                let target = fs::read_to_string(base.join(&resolved)).unwrap_or_default();
                if !anchors(&target).contains(anchor) {
                    problems.push(format!(
                        "{where_}: {} has no heading with the anchor #{anchor}",
                        resolved.display()
                    ));
                }
            }
        }
    }
    problems
}

/// Every `.md` file under `dir` (relative to `base`), sorted.
fn markdown_under(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(base.join(dir)) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let rel = dir.join(e.file_name());
        if e.path().is_dir() {
            // docs/book is mdBook's output, not a source.
            if rel != Path::new("docs/book") {
                markdown_under(base, &rel, out);
            }
        } else if rel.extension().is_some_and(|x| x == "md") {
            out.push(rel);
        }
    }
}

/// The files whose links are checked: the README, the book and the other docs, the operator
/// kit's page.
fn checked_files(base: &Path) -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from("README.md"),
        PathBuf::from("deploy/README.md"),
    ];
    markdown_under(base, Path::new("docs"), &mut files);
    files
}

#[test]
fn every_relative_link_resolves() {
    let base = root();
    let files = checked_files(&base);
    assert!(
        files.iter().any(|f| f == Path::new("docs/src/SUMMARY.md")),
        "the book is missing: {files:?}"
    );
    let problems = broken_links(&base, &files);
    assert!(
        problems.is_empty(),
        "{} broken link(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let base = root();
    let summary_path = Path::new("docs/src/SUMMARY.md");
    let summary = fs::read_to_string(base.join(summary_path)).expect("docs/src/SUMMARY.md");
    let listed: BTreeSet<PathBuf> = links(summary_path, &summary)
        .into_iter()
        .filter_map(|l| normalize(&Path::new("docs/src").join(l.target)))
        .collect();
    let mut pages = Vec::new();
    markdown_under(&base, Path::new("docs/src"), &mut pages);
    let missing: Vec<_> = pages
        .iter()
        .filter(|p| p.as_path() != summary_path && !listed.contains(*p))
        .collect();
    assert!(
        missing.is_empty(),
        "pages mdbook would not render (add them to docs/src/SUMMARY.md): {missing:?}"
    );
}

#[test]
fn the_readme_is_a_short_front_page_with_the_quick_start() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into the book (docs/src/)"
    );
    for command in QUICK_START {
        assert!(
            readme.lines().any(|l| l == command),
            "README.md lost the quick start's command, byte for byte: {command:?}"
        );
    }
}

#[test]
fn every_book_page_with_rust_code_is_a_doctest() {
    let base = root();
    let lib = fs::read_to_string(base.join("src/lib.rs")).expect("src/lib.rs");
    let mut pages = Vec::new();
    markdown_under(&base, Path::new("docs/src"), &mut pages);
    let missing: Vec<_> = pages
        .iter()
        .filter(|p| {
            let text = fs::read_to_string(base.join(p)).unwrap_or_default();
            let include = format!("include_str!(\"../{}\")", p.display());
            text.lines().any(|l| l.starts_with("```rust")) && !lib.contains(&include)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "book pages whose Rust examples no doctest compiles (list them in src/lib.rs, mod book_doctests): {missing:?}"
    );
}

/// The checker itself, on a tree made for it: it must catch a missing file, a missing anchor
/// and a link out of the repository, and accept what is fine (code is not a link, an anchor
/// of a repeated heading, a heading with code and punctuation).
#[test]
fn the_checker_catches_broken_links_and_anchors() {
    let base = std::env::temp_dir().join(format!("sfu-docs-check-{}", std::process::id()));
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(base.join("docs/src")).unwrap();
    fs::write(
        base.join("docs/src/a.md"),
        "# Page A\n\n## HTTP limits (`--metrics-addr` and `--serve`)\n\n## Notes\n\n## Notes\n\n\
         ```sh\n# not a heading\n[not](a-link.md)\n```\n",
    )
    .unwrap();
    fs::write(
        base.join("README.md"),
        "[ok](docs/src/a.md) and [ok](docs/src/a.md#http-limits---metrics-addr-and---serve)\n\
         [ok](docs/src/a.md#notes-1) `[code](nowhere.md)` [ok](#top)\n\n# Top\n\n\
         [missing file](docs/src/b.md)\n[missing anchor](docs/src/a.md#not-a-heading)\n\
         [outside](../elsewhere.md)\n![missing image](docs/pic.png)\n[web](https://example.com/x.md)\n",
    )
    .unwrap();
    let problems = broken_links(&base, &[PathBuf::from("README.md")]);
    let _ = fs::remove_dir_all(&base);
    let has = |needle: &str| problems.iter().any(|p| p.contains(needle));
    assert!(has("`docs/src/b.md`: no file"), "{problems:#?}");
    assert!(has("#not-a-heading"), "{problems:#?}");
    assert!(
        has("`../elsewhere.md` leaves the repository"),
        "{problems:#?}"
    );
    assert!(has("`docs/pic.png`: no file"), "{problems:#?}");
    assert_eq!(problems.len(), 4, "only those four: {problems:#?}");
}

const EVENTS: &str = "docs/src/reference/events.md";

use pages::report;

/// The Settings table of `configuration.md` has a row for every setting of a `ConfigBuilder`
/// (`pages::settings`: the fields its `Debug` shows) and names no other: each identifier of a
/// row's `setting` and `Rust` columns is a setting, or `timings` (the setter of all nine
/// timings); each row but the timing preset's names a setting.
#[test]
fn configuration_reference_has_a_row_for_every_setting_and_no_other() {
    let settings = pages::settings();
    assert!(
        settings.len() > 20 && settings.iter().any(|s| s == "heartbeat_ttl"),
        "the settings were not read from ConfigBuilder's Debug: {settings:?}"
    );
    let rows = pages::setting_rows(&Page::reference("configuration.md"));
    let mut problems = Vec::new();
    for setting in &settings {
        if !rows.iter().any(|r| r.names.contains(setting)) {
            problems.push(format!(
                "the setting `{setting}` (a field of ConfigBuilder) has no row in the Settings table of {CONFIGURATION}"
            ));
        }
    }
    for row in &rows {
        for name in &row.names {
            if name != "timings" && !settings.contains(name) {
                problems.push(format!(
                    "{CONFIGURATION}:{}: `{name}` is no setting of ConfigBuilder (its settings: {settings:?})",
                    row.line
                ));
            }
        }
        let preset = row.names == ["timings"];
        if !preset && !row.names.iter().any(|n| settings.contains(n)) {
            problems.push(format!(
                "{CONFIGURATION}:{}: the row names no setting of ConfigBuilder ({:?})",
                row.line, row.names
            ));
        }
    }
    report(&problems, &format!("fix {CONFIGURATION}"));
}

/// The environment variables of `configuration.md` are those `Config::from_env` reads
/// (`sfu_redis::config::ENV_VARS`), both ways: in the Settings table, and in the list that opens
/// `## Environment variables`.
#[test]
fn configuration_reference_names_the_environment_variables_the_library_reads() {
    let page = Page::reference("configuration.md");
    let code: BTreeSet<String> = ENV_VARS.iter().map(|v| (*v).to_owned()).collect();
    let mut problems = Vec::new();
    let table: BTreeSet<String> = pages::setting_rows(&page)
        .into_iter()
        .flat_map(|r| r.env_vars)
        .collect();
    let section = page
        .section("Environment variables")
        .unwrap_or_else(|| panic!("{CONFIGURATION}: no `## Environment variables` section"));
    // Its first paragraph: the variables of `Config::from_env`.
    let paragraph: String = section
        .lines
        .iter()
        .map(|(_, l)| l.as_str())
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let listed: BTreeSet<String> = pages::env_vars_in(&paragraph).into_iter().collect();
    for (what, names) in [
        ("the Settings table", &table),
        ("the list under `## Environment variables`", &listed),
    ] {
        for v in code.difference(names) {
            problems.push(format!(
                "Config::from_env reads {v} (ENV_VARS), which {what} of {CONFIGURATION} does not name"
            ));
        }
        for v in names.difference(&code) {
            problems.push(format!(
                "{what} of {CONFIGURATION} names {v}, which Config::from_env does not read (ENV_VARS)"
            ));
        }
    }
    report(&problems, &format!("fix {CONFIGURATION}"));
}

/// The table under `## The events` of `events.md` lists exactly the library's events
/// (`Event::NAMES`), each with its Rust variant; and the C kinds the page names are exactly
/// those of `SfuEventKind` in `capi/include/sfu_redis.h` (the generated header, checked against
/// cbindgen by `capi/tests/ffi_header.rs`) but `SFU_EVENT_NONE`, one per event:
/// `SFU_EVENT_<NAME>`.
#[test]
fn events_reference_lists_every_event_of_the_library_and_no_other() {
    let page = Page::reference("events.md");
    let mut problems = Vec::new();
    let table = page
        .section("The events")
        .and_then(|s| s.table_with("event"))
        .unwrap_or_else(|| {
            panic!("{EVENTS}: no table with an `event` column under `## The events`")
        });
    let (name_col, rust_col) = (
        table.column("event").expect("event"),
        table
            .column("Rust")
            .unwrap_or_else(|| panic!("{EVENTS}: no Rust column")),
    );
    let mut documented = BTreeSet::new();
    for row in &table.rows {
        for name in pages::code_spans(table.cell(row, name_col)) {
            if !Event::NAMES.contains(&name.as_str()) {
                problems.push(format!(
                    "{EVENTS}:{}: `{name}` is no event of the library (Event::NAMES: {:?})",
                    row.line,
                    Event::NAMES
                ));
            }
            // The variant is the name in CamelCase (src/event.rs checks that rule).
            let variant: String = name
                .split('_')
                .filter(|w| !w.is_empty())
                .map(|w| w[..1].to_uppercase() + &w[1..])
                .collect();
            let want = format!("Event::{variant}");
            if pages::code_spans(table.cell(row, rust_col)) != [want.clone()] {
                problems.push(format!(
                    "{EVENTS}:{}: the Rust of `{name}` is `{want}`",
                    row.line
                ));
            }
            documented.insert(name);
        }
    }
    for name in Event::NAMES {
        if !documented.contains(name) {
            problems.push(format!(
                "the library emits `{name}` (Event::NAMES), which the table under `## The events` of {EVENTS} does not list"
            ));
        }
    }

    let header_path = "capi/include/sfu_redis.h";
    let header = fs::read_to_string(root().join(header_path)).expect(header_path);
    let body = header
        .split("enum SfuEventKind")
        .nth(1)
        .and_then(|rest| rest.split("};").next())
        .unwrap_or_else(|| panic!("{header_path}: no enum SfuEventKind"));
    let kinds: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.trim().split([' ', '=', ',']).next())
        .filter(|w| w.starts_with("SFU_EVENT_") && *w != "SFU_EVENT_NONE")
        .map(str::to_owned)
        .collect();
    let expected: BTreeSet<String> = Event::NAMES
        .iter()
        .map(|n| format!("SFU_EVENT_{}", n.to_uppercase()))
        .collect();
    if kinds != expected {
        problems.push(format!(
            "{header_path}: the kinds of SfuEventKind {kinds:?} are not one per event of Event::NAMES {expected:?}"
        ));
    }
    let where_ = page
        .sections
        .iter()
        .find(|s| s.title == "Where events appear")
        .unwrap_or_else(|| panic!("{EVENTS}: no `## Where events appear` section"));
    let on_page: BTreeSet<String> = where_
        .tables
        .iter()
        .flat_map(|t| t.rows.iter().flat_map(|r| r.cells.iter()))
        .flat_map(|c| pages::code_spans(c))
        .filter(|s| s.starts_with("SFU_EVENT_"))
        .collect();
    for k in kinds.difference(&on_page) {
        problems.push(format!(
            "{header_path} has the C kind {k}, which `## Where events appear` of {EVENTS} does not name"
        ));
    }
    for k in on_page.difference(&kinds) {
        problems.push(format!(
            "`## Where events appear` of {EVENTS} names the C kind {k}, which {header_path} does not have"
        ));
    }
    report(&problems, &format!("fix {EVENTS}"));
}

/// The page reader the reference checks rely on, on a page made for it: sections and their
/// anchors, tables (a `|` inside code is no cell border), code spans, flags, variables,
/// identifiers and in-page links; and the settings read from the library.
#[test]
fn the_reference_page_reader_reads_sections_tables_and_code() {
    let text = "intro [g](#global-flags)\n\n## Global flags\n\n| flag | environment | what |\n\
                |---|---|---|\n| `-h`, `--help` | | help |\n\
                | `--redis-url URL` | `REDIS_URL` | a `a|b` pipe \\| escaped |\n\n\
                ```sh\n## not a heading\n| not | a table |\n```\n\n\
                ## `sfu-redis` node\n\nTakes [the global flags](#global-flags) and [x](other.md#y).\n\n\
                | setting | Rust (`ConfigBuilder`) |\n|---|---|\n\
                | `SFU_TLS_INSECURE=1` | `timings(Timings::...)`, `reap_batch` |\n";
    let page = Page::parse("t.md", text);
    let titles: Vec<&str> = page.sections.iter().map(|s| s.title.as_str()).collect();
    assert_eq!(titles, ["", "Global flags", "sfu-redis node"]);
    assert_eq!(page.sections[2].anchor, "sfu-redis-node");
    let global = page.section("Global flags").unwrap();
    assert_eq!(global.tables.len(), 1, "{global:#?}");
    let t = &global.tables[0];
    assert_eq!(t.header, ["flag", "environment", "what"]);
    assert_eq!(t.rows.len(), 2);
    assert_eq!(t.rows[1].cells[2], "a `a|b` pipe | escaped");
    assert_eq!(pages::flags_in(&t.rows[0].cells[0]), ["-h", "--help"]);
    assert_eq!(pages::flags_in(&t.rows[1].cells[0]), ["--redis-url"]);
    assert_eq!(pages::env_vars_in(&t.rows[1].cells[1]), ["REDIS_URL"]);
    let node = page.by_anchor("sfu-redis-node").unwrap();
    assert_eq!(node.in_page_links(), ["global-flags"]);
    assert_eq!(page.sections[0].in_page_links(), ["global-flags"]);
    let t = node.table_with("Rust").unwrap();
    assert_eq!(t.column("rust"), Some(1));
    assert_eq!(
        pages::env_vars_in(&t.rows[0].cells[0]),
        ["SFU_TLS_INSECURE"]
    );
    assert_eq!(
        pages::identifiers_in(&t.rows[0].cells[1]),
        ["timings", "reap_batch"]
    );
    assert_eq!(pages::code_spans("``a ` b`` and `c`"), ["a ` b", "c"]);

    let settings = pages::settings();
    for s in [
        "redis_url",
        "tls_ca_file",
        "tls_insecure",
        "sentinel_password",
        "namespace",
    ] {
        assert!(settings.iter().any(|x| x == s), "{s} in {settings:?}");
    }
    for s in [
        "heartbeat_interval",
        "command_timeout",
        "reap_batch",
        "reap_pace",
        "metrics",
    ] {
        assert!(settings.iter().any(|x| x == s), "{s} in {settings:?}");
    }
    assert!(
        !settings.iter().any(|x| x == "timings" || x == "tls"),
        "{settings:?}"
    );
}

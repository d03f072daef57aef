//! Reading the book's reference pages (`docs/src/reference/*.md`) for the tests that check them
//! against the code (issue 30, item 3): a page's sections (by heading), their tables (cells
//! split outside code spans), the code spans of a cell, the in-page links of a section; and the
//! library's list of settings (the fields of a `ConfigBuilder`).
//!
//! Shared by `tests/it/reference.rs`, `tests/it/metrics.rs`, `tests/docs.rs` and the unit tests
//! of `cli/` and `capi/` that check their own lists (`#[path]` includes): it needs nothing but
//! `std` and `sfu_redis`. Its own test, on a page made for it, is in `tests/docs.rs`.
#![allow(dead_code)]

use std::path::PathBuf;

/// One reference page: its path for messages (`docs/src/reference/cli.md`) and its sections.
#[derive(Debug)]
pub struct Page {
    pub path: String,
    pub sections: Vec<Section>,
}

/// The text under one heading, up to the next heading of any level (the text before the first
/// heading is a section with level 0 and an empty title).
#[derive(Debug)]
pub struct Section {
    pub level: usize,
    /// The heading as rendered: code spans keep their text, backticks go.
    pub title: String,
    /// GitHub's (and mdBook's) anchor of the heading.
    pub anchor: String,
    /// Its 1-based line number in the page.
    pub line: usize,
    /// Every line outside fenced code blocks, with its 1-based number.
    pub lines: Vec<(usize, String)>,
    pub tables: Vec<Table>,
}

/// A pipe table: its header cells and its rows.
#[derive(Debug)]
pub struct Table {
    pub line: usize,
    pub header: Vec<String>,
    pub rows: Vec<Row>,
}

#[derive(Debug)]
pub struct Row {
    pub line: usize,
    pub cells: Vec<String>,
}

/// The directory holding `docs/`: the crate's own (`CARGO_MANIFEST_DIR` of the includer) or
/// its parent's (the `cli` and `capi` packages).
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    [here.clone(), here.join("..")]
        .into_iter()
        .find(|d| d.join("docs/src/reference").is_dir())
        .unwrap_or_else(|| panic!("no docs/src/reference beside {}", here.display()))
}

/// The lines of a Markdown text outside fenced code blocks (``` or ~~~, closed by a run at
/// least as long), each with its 1-based number.
pub fn outside_fences(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let opener = ['`', '~']
            .into_iter()
            .find(|c| trimmed.starts_with(&c.to_string().repeat(3)));
        if let Some(c) = opener {
            let n = trimmed.chars().take_while(|x| *x == c).count();
            match fence {
                None => {
                    fence = Some((c, n));
                    continue;
                }
                Some((fc, fnum)) if fc == c && n >= fnum && trimmed[n..].trim().is_empty() => {
                    fence = None;
                    continue;
                }
                _ => {}
            }
        }
        if fence.is_none() {
            out.push((i + 1, line));
        }
    }
    out
}

impl Page {
    /// `docs/src/reference/<name>`.
    pub fn reference(name: &str) -> Page {
        let rel = format!("docs/src/reference/{name}");
        let text = std::fs::read_to_string(repo_root().join(&rel))
            .unwrap_or_else(|e| panic!("read {rel}: {e}"));
        Page::parse(&rel, &text)
    }

    pub fn parse(path: &str, text: &str) -> Page {
        let mut sections = vec![Section {
            level: 0,
            title: String::new(),
            anchor: String::new(),
            line: 1,
            lines: Vec::new(),
            tables: Vec::new(),
        }];
        for (number, line) in outside_fences(text) {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
                let title = line[hashes..]
                    .trim()
                    .trim_end_matches('#')
                    .trim()
                    .replace('`', "");
                sections.push(Section {
                    level: hashes,
                    anchor: slug(&title),
                    title,
                    line: number,
                    lines: Vec::new(),
                    tables: Vec::new(),
                });
                continue;
            }
            sections
                .last_mut()
                .expect("a section")
                .lines
                .push((number, line.to_owned()));
        }
        for s in &mut sections {
            s.tables = tables(&s.lines);
        }
        Page {
            path: path.to_owned(),
            sections,
        }
    }

    /// The section titled `title` (exactly, backticks dropped).
    pub fn section(&self, title: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.title == title)
    }

    /// The section whose anchor is `anchor` (without `#`).
    pub fn by_anchor(&self, anchor: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.anchor == anchor)
    }
}

impl Section {
    /// The anchors of the in-page links (`[text](#anchor)`) of this section's prose.
    pub fn in_page_links(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (_, line) in &self.lines {
            let line = blank_code_spans(line);
            let mut rest = line.as_str();
            while let Some(at) = rest.find("](#") {
                let after = &rest[at + 3..];
                let end = after.find(')').unwrap_or(after.len());
                out.push(after[..end].trim().to_owned());
                rest = &after[end..];
            }
        }
        out
    }

    /// Its first table whose header has a column named `column`.
    pub fn table_with(&self, column: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.column(column).is_some())
    }
}

impl Table {
    /// The index of the column whose header is `name`, or starts with `name` and a space
    /// (`Rust` finds ``Rust (`ConfigBuilder`)``); case-insensitive.
    pub fn column(&self, name: &str) -> Option<usize> {
        let name = name.to_lowercase();
        self.header.iter().position(|h| {
            let h = h.replace('`', "").to_lowercase();
            h == name || h.starts_with(&format!("{name} "))
        })
    }

    /// The cell of `row` in column `col` (empty when the row is short).
    pub fn cell<'a>(&self, row: &'a Row, col: usize) -> &'a str {
        row.cells.get(col).map_or("", String::as_str)
    }
}

/// The tables among `lines`: a header row, a delimiter row (`|---|`), then rows, each a line
/// starting with `|`.
fn tables(lines: &[(usize, String)]) -> Vec<Table> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < lines.len() {
        let (number, head) = &lines[i];
        let delim = lines[i + 1].1.trim();
        let is_delim = delim.starts_with('|')
            && delim
                .chars()
                .all(|c| matches!(c, '|' | '-' | ':' | ' ' | '\t'));
        if !head.trim_start().starts_with('|') || !is_delim {
            i += 1;
            continue;
        }
        let mut table = Table {
            line: *number,
            header: split_row(head),
            rows: Vec::new(),
        };
        i += 2;
        while i < lines.len() && lines[i].1.trim_start().starts_with('|') {
            table.rows.push(Row {
                line: lines[i].0,
                cells: split_row(&lines[i].1),
            });
            i += 1;
        }
        out.push(table);
    }
    out
}

/// The cells of a table row: split at each `|` outside code spans (and not escaped as `\|`),
/// the outer pipes dropped, each cell trimmed.
pub fn split_row(line: &str) -> Vec<String> {
    let line = line.trim();
    let blanked: Vec<char> = blank_code_spans(line).chars().collect();
    let chars: Vec<char> = line.chars().collect();
    let mut cells = Vec::new();
    let mut cell = String::new();
    for (k, c) in chars.iter().enumerate() {
        if blanked[k] == '|' && (k == 0 || chars[k - 1] != '\\') {
            cells.push(std::mem::take(&mut cell));
        } else {
            cell.push(*c);
        }
    }
    cells.push(cell);
    if cells.first().is_some_and(|c| c.trim().is_empty()) {
        cells.remove(0);
    }
    if cells.last().is_some_and(|c| c.trim().is_empty()) {
        cells.pop();
    }
    cells
        .into_iter()
        .map(|c| c.trim().replace("\\|", "|"))
        .collect()
}

/// The code spans of `chars` (a run of n backticks up to the next run of exactly n; an
/// unmatched run is literal text): for each, where its opening run starts, the run's length
/// and where its closing run starts.
fn span_ranges(chars: &[char]) -> Vec<(usize, usize, usize)> {
    let run = |at: usize| chars[at..].iter().take_while(|c| **c == '`').count();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let n = run(i);
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = run(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.push((i, n, end));
                i = end + n;
            }
            None => i += n,
        }
    }
    out
}

/// The code spans of `text`, their contents trimmed.
pub fn code_spans(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    span_ranges(&chars)
        .into_iter()
        .map(|(i, n, end)| {
            chars[i + n..end]
                .iter()
                .collect::<String>()
                .trim()
                .to_owned()
        })
        .collect()
}

/// `line` with every code span's characters (backticks included) replaced by spaces, so that
/// a link or a flag written inside code is not taken for one.
pub fn blank_code_spans(line: &str) -> String {
    let mut chars: Vec<char> = line.chars().collect();
    for (i, n, end) in span_ranges(&chars.clone()) {
        chars[i..end + n].iter_mut().for_each(|c| *c = ' ');
    }
    chars.into_iter().collect()
}

/// Fails with every difference found between a reference page and the code, and what to fix.
pub fn report(problems: &[String], fix: &str) {
    assert!(
        problems.is_empty(),
        "{} difference(s) between the reference and the code ({fix}):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// GitHub's anchor of a heading's text: lower-cased, everything but letters, digits, `_`, `-`
/// and spaces dropped, each space a `-` (repeated headings' `-1` suffixes are not needed here).
pub fn slug(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The flags a cell names: each code span starting with `-`, up to its first space
/// (`` `--redis-url URL` `` is `--redis-url`).
pub fn flags_in(cell: &str) -> Vec<String> {
    code_spans(cell)
        .into_iter()
        .filter(|s| s.starts_with('-') && s.len() > 1)
        .map(|s| s.split_whitespace().next().unwrap_or_default().to_owned())
        .collect()
}

/// The environment variables a cell names: each code span that is an upper-case name
/// (`REDIS_URL`, `SFU_STAGE`), or one with a value (`SFU_TLS_INSECURE=1` is `SFU_TLS_INSECURE`).
pub fn env_vars_in(cell: &str) -> Vec<String> {
    code_spans(cell)
        .into_iter()
        .filter_map(|s| {
            let name = s.split('=').next().unwrap_or_default().to_owned();
            let ok = name.len() > 1
                && name.starts_with(|c: char| c.is_ascii_uppercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            ok.then_some(name)
        })
        .collect()
}

/// The identifiers a cell names: each code span that is a lower-case Rust identifier, or a call
/// (`` `timings(Timings::...)` `` is `timings`).
pub fn identifiers_in(cell: &str) -> Vec<String> {
    code_spans(cell)
        .into_iter()
        .filter_map(|s| {
            let name = s.split('(').next().unwrap_or_default().to_owned();
            let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            ok.then_some(name)
        })
        .collect()
}

/// Every setting of a node's configuration, by the name the configuration's errors and the
/// Settings table of `configuration.md` give it, read from the library itself: the fields
/// `ConfigBuilder`'s `Debug` shows (every field a builder carries), nested ones flattened. A
/// nested struct's fields are named `<outer>_<field>` as their setters are (`tls_ca_file`,
/// `sentinel_user`), except the timings, named by their `Timings` field (`heartbeat_ttl`): they
/// are set together with `ConfigBuilder::timings`.
pub fn settings() -> Vec<String> {
    let debug = format!("{:#?}", sfu_redis::ConfigBuilder::default());
    let mut stack: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in debug.lines().skip(1) {
        let t = line.trim();
        if t == "}" || t == "}," {
            stack.pop();
            continue;
        }
        let Some((name, value)) = t.split_once(": ") else {
            continue;
        };
        if value.ends_with('{') {
            stack.push(name.to_owned());
            continue;
        }
        out.push(match stack.last().map(String::as_str) {
            None | Some("timings") => name.to_owned(),
            Some(outer) => format!("{outer}_{name}"),
        });
    }
    out
}

/// One row of the Settings table of `configuration.md`: what it names in each column.
#[derive(Debug)]
pub struct SettingRow {
    /// Its line in the page.
    pub line: usize,
    /// The identifiers of its `setting` and `Rust` columns (`heartbeat_ttl`, `timings`;
    /// `tls_cert_file`, `tls_key_file`).
    pub names: Vec<String>,
    /// The flags of its `environment / CLI flag` column.
    pub flags: Vec<String>,
    /// The environment variables of that column.
    pub env_vars: Vec<String>,
    /// The keys of its `C key` column.
    pub c_keys: Vec<String>,
}

/// The path of the configuration reference, for messages.
pub const CONFIGURATION: &str = "docs/src/reference/configuration.md";

/// The rows of the Settings table of `configuration.md` (the table of its `## Settings`
/// section with the columns `setting`, `Rust`, `environment / CLI flag` and `C key`).
pub fn setting_rows(page: &Page) -> Vec<SettingRow> {
    let section = page
        .section("Settings")
        .unwrap_or_else(|| panic!("{}: no `## Settings` section", page.path));
    let table = section
        .table_with("environment / CLI flag")
        .unwrap_or_else(|| panic!("{}: no Settings table", page.path));
    let col = |name: &str| {
        table.column(name).unwrap_or_else(|| {
            panic!(
                "{}:{}: the Settings table has no column {name:?}: {:?}",
                page.path, table.line, table.header
            )
        })
    };
    let (setting, rust, env_flag, c_key) = (
        col("setting"),
        col("Rust"),
        col("environment / CLI flag"),
        col("C key"),
    );
    table
        .rows
        .iter()
        .map(|row| {
            let mut names = identifiers_in(table.cell(row, setting));
            names.extend(identifiers_in(table.cell(row, rust)));
            names.sort();
            names.dedup();
            SettingRow {
                line: row.line,
                names,
                flags: flags_in(table.cell(row, env_flag)),
                env_vars: env_vars_in(table.cell(row, env_flag)),
                c_keys: identifiers_in(table.cell(row, c_key)),
            }
        })
        .collect()
}

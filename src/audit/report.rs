//! The audit's result ([`AuditReport`]) and how the findings and their repair outcomes
//! become its problems.

use serde_json::{json, Value as Json};

use super::repair::{Entry, Outcome};
use super::Problem;

/// The result of [`audit`](super::audit): the problems found (in two scans, unless the settle
/// delay is zero) and how many were repaired.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditReport {
    /// `<namespace>:<stage>:<branch>` that was audited.
    pub prefix: String,
    /// Every problem found, repaired or not, sorted by kind and key.
    pub problems: Vec<Problem>,
    /// How many of them were repaired.
    pub repaired: usize,
}

impl AuditReport {
    /// True when no problem remains: none was found, or every one was repaired.
    pub fn clean(&self) -> bool {
        self.problems.iter().all(|p| p.repaired)
    }

    /// The problems that remain (not repaired).
    pub fn remaining(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| !p.repaired)
    }

    /// The JSON object printed by `sfu-redis fsck --json`:
    /// `{"clean": bool, "problems": [{"kind", "key", "detail", "repaired"}...], "repaired": n}`.
    pub fn to_json(&self) -> Json {
        json!({
            "clean": self.clean(),
            "problems": self.problems.iter().map(|p| json!({
                "kind": p.kind.as_str(),
                "key": p.key,
                "detail": p.detail,
                "repaired": p.repaired,
            })).collect::<Vec<_>>(),
            "repaired": self.repaired,
        })
    }
}

impl AuditReport {
    /// The report of `prefix` from the findings and their repair outcomes: problems that went
    /// away by themselves are dropped, a refused fix adds its reason to the detail.
    pub(super) fn from_entries(prefix: &str, entries: Vec<Entry>) -> AuditReport {
        let problems: Vec<Problem> = entries.into_iter().filter_map(problem).collect();
        AuditReport {
            prefix: prefix.to_owned(),
            repaired: problems.iter().filter(|p| p.repaired).count(),
            problems,
        }
    }
}

/// The problem an entry reports, `None` when it was resolved meanwhile.
fn problem(e: Entry) -> Option<Problem> {
    let (repaired, note) = match e.outcome {
        Outcome::Resolved => return None,
        Outcome::Open => (false, None),
        Outcome::Repaired => (true, None),
        Outcome::Left(why) => (false, Some(why)),
    };
    let mut p = e.f.into_problem();
    if let Some(why) = note {
        p.detail.push_str(&format!(" (not repaired: {why})"));
    }
    p.repaired = repaired;
    Some(p)
}

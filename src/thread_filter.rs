//! Which threads a session samples: `--thread NAME|TID` (repeatable) and
//! `--main-thread`. The snapshot asks before it walks a thread's frames
//! (`python::snapshot`), so a thread left out costs no stack read.
//!
//! A thread is selected when any criterion holds: its native id is one of
//! the TIDs, it is the main thread (its native id is the pid), or its name
//! matches one of the globs. The name is the one every output shows: the
//! `threading` name, else the kernel's. A criterion that needs what is not
//! known yet (a new thread's name before the name cache has read it) leaves
//! the thread undecided: it is walked, and decided once the name is known.

/// The selection; the default selects every thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadFilter {
    /// Globs on thread names (`*`, `?`, `[abc]`, `[a-z]`, `[!abc]`).
    pub names: Vec<String>,
    /// Native (kernel) thread ids.
    pub tids: Vec<u64>,
    /// The thread whose native id is the pid.
    pub main: bool,
}

/// One `--thread` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Name(String),
    Tid(u64),
}

impl std::str::FromStr for Selector {
    type Err = String;

    /// Digits only is a TID (a thread named by digits is selected with a
    /// glob, `[1]23`); anything else a name glob.
    fn from_str(v: &str) -> Result<Selector, String> {
        if v.is_empty() {
            return Err("--thread needs a thread name (a glob) or a native thread id".into());
        }
        if v.bytes().all(|b| b.is_ascii_digit()) {
            return v.parse().map(Selector::Tid).map_err(|_| format!("--thread {v}: not a thread id"));
        }
        Ok(Selector::Name(v.to_string()))
    }
}

/// What is known of a thread's name when it is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKnown<'a> {
    /// Not read yet.
    Unknown,
    /// Read: this name, or none at all.
    Known(Option<&'a str>),
}

impl ThreadFilter {
    /// From parsed `--thread` values and `--main-thread`.
    pub fn new(selectors: &[Selector], main: bool) -> ThreadFilter {
        let mut f = ThreadFilter { main, ..ThreadFilter::default() };
        for s in selectors {
            match s {
                Selector::Name(n) => f.names.push(n.clone()),
                Selector::Tid(t) => f.tids.push(*t),
            }
        }
        f
    }

    /// From `--thread` values as given and `--main-thread`.
    pub fn parse(values: &[String], main: bool) -> Result<ThreadFilter, String> {
        let selectors = values.iter().map(|v| v.parse()).collect::<Result<Vec<Selector>, String>>()?;
        Ok(ThreadFilter::new(&selectors, main))
    }

    /// Selects every thread: nothing to decide.
    pub fn is_all(&self) -> bool {
        self.names.is_empty() && self.tids.is_empty() && !self.main
    }

    /// Whether deciding needs thread names.
    pub fn needs_names(&self) -> bool {
        !self.names.is_empty()
    }

    /// Whether the thread `native_id` of process `pid`, named as `name`
    /// says, is selected; None while that depends on what is not known yet.
    pub fn decide(&self, pid: Option<i32>, native_id: Option<u64>, name: NameKnown) -> Option<bool> {
        if self.is_all() {
            return Some(true);
        }
        let mut undecided = false;
        match native_id {
            Some(t) if self.tids.contains(&t) || (self.main && pid.is_some_and(|p| u64::try_from(p) == Ok(t))) => return Some(true),
            Some(_) => {}
            None => undecided |= !self.tids.is_empty() || self.main,
        }
        if self.needs_names() {
            match name {
                NameKnown::Known(Some(n)) if self.names.iter().any(|g| glob_match(g, n)) => return Some(true),
                NameKnown::Known(_) => {}
                NameKnown::Unknown => undecided = true,
            }
        }
        if undecided { None } else { Some(false) }
    }

    /// The options that made this filter, for messages.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.names.iter().map(|n| format!("--thread {n:?}")).collect();
        parts.extend(self.tids.iter().map(|t| format!("--thread {t}")));
        if self.main {
            parts.push("--main-thread".into());
        }
        parts.join(" ")
    }
}

/// One element of a glob.
#[derive(Debug, PartialEq)]
enum Tok {
    Star,
    One,
    Lit(char),
    /// `[...]`: ranges (single characters are ranges of one), negated by `!`.
    Class(Vec<(char, char)>, bool),
}

fn tokens(glob: &str) -> Vec<Tok> {
    let chars: Vec<char> = glob.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => out.push(Tok::Star),
            '?' => out.push(Tok::One),
            '[' => {
                if let Some((tok, next)) = class(&chars, i) {
                    out.push(tok);
                    i = next;
                    continue;
                }
                // An unclosed `[` is itself.
                out.push(Tok::Lit('['));
            }
            c => out.push(Tok::Lit(c)),
        }
        i += 1;
    }
    out
}

/// The class opening at `chars[open]` and the index after it; a `]` right
/// after `[` or `[!` is a member, as in shells.
fn class(chars: &[char], open: usize) -> Option<(Tok, usize)> {
    let mut i = open + 1;
    let negated = chars.get(i) == Some(&'!');
    if negated {
        i += 1;
    }
    let first = i;
    let mut ranges = Vec::new();
    while i < chars.len() {
        let c = chars[i];
        if c == ']' && i > first {
            return Some((Tok::Class(ranges, negated), i + 1));
        }
        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&e| e != ']') {
            ranges.push((c, chars[i + 2]));
            i += 3;
        } else {
            ranges.push((c, c));
            i += 1;
        }
    }
    None
}

/// Whether `name` matches `glob` as a whole (shell rules; no escapes). Linear
/// backtracking on the last `*`: at most len(glob) × len(name) steps.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let toks = tokens(glob);
    let name: Vec<char> = name.chars().collect();
    let matches = |t: &Tok, c: char| match t {
        Tok::Star => false,
        Tok::One => true,
        Tok::Lit(l) => *l == c,
        Tok::Class(ranges, negated) => ranges.iter().any(|&(a, b)| a <= c && c <= b) != *negated,
    };
    let (mut t, mut n) = (0, 0);
    // Where the last `*` was, and how much of the name it has taken.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if t < toks.len() && toks[t] == Tok::Star {
            star = Some((t, n));
            t += 1;
        } else if t < toks.len() && matches(&toks[t], name[n]) {
            t += 1;
            n += 1;
        } else if let Some((st, sn)) = star {
            t = st + 1;
            n = sn + 1;
            star = Some((st, sn + 1));
        } else {
            return false;
        }
    }
    toks[t..].iter().all(|t| *t == Tok::Star)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        for (glob, name) in [
            ("worker", "worker"),
            ("worker-*", "worker-12"),
            ("*", ""),
            ("*-1", "a-b-1"),
            ("w?rk*", "work"),
            ("[mM]ain*", "MainThread"),
            ("pool-[0-9]", "pool-7"),
            ("pool-[!0-9]", "pool-x"),
            ("[]x]", "]"),
            ("a[", "a["),
            ("ünï*名前", "ünïcødé-名前"),
            ("*a*b*c", "xxaxxbxxbxc"),
        ] {
            assert!(glob_match(glob, name), "{glob} should match {name}");
        }
        for (glob, name) in [("worker", "worker-1"), ("worker-*", "worker"), ("?", ""), ("pool-[0-9]", "pool-x"), ("pool-[!0-9]", "pool-1"), ("*a*b*c", "abcx")]
        {
            assert!(!glob_match(glob, name), "{glob} should not match {name}");
        }
        // Backtracking stays linear in practice: a long name of near misses.
        let name = "a".repeat(4096);
        assert!(!glob_match("*a*a*a*a*b", &name));
    }

    #[test]
    fn parse_tells_tids_from_names() {
        let f = ThreadFilter::parse(&["worker-*".into(), "1234".into(), "[1]23".into()], true).unwrap();
        assert_eq!(f, ThreadFilter { names: vec!["worker-*".into(), "[1]23".into()], tids: vec![1234], main: true });
        assert!(ThreadFilter::parse(&["".into()], false).unwrap_err().contains("--thread"));
        assert!(ThreadFilter::parse(&["99999999999999999999999".into()], false).unwrap_err().contains("not a thread id"));
        assert!(ThreadFilter::parse(&[], false).unwrap().is_all());
        assert_eq!(f.describe(), r#"--thread "worker-*" --thread "[1]23" --thread 1234 --main-thread"#);
    }

    #[test]
    fn decisions() {
        let pid = Some(100);
        let all = ThreadFilter::default();
        assert_eq!(all.decide(None, None, NameKnown::Unknown), Some(true));

        let main = ThreadFilter { main: true, ..Default::default() };
        assert_eq!(main.decide(pid, Some(100), NameKnown::Unknown), Some(true));
        assert_eq!(main.decide(pid, Some(101), NameKnown::Unknown), Some(false));
        assert_eq!(main.decide(pid, None, NameKnown::Known(Some("MainThread"))), None);

        let by_tid = ThreadFilter { tids: vec![101], ..Default::default() };
        assert_eq!(by_tid.decide(pid, Some(101), NameKnown::Unknown), Some(true));
        assert_eq!(by_tid.decide(pid, Some(100), NameKnown::Unknown), Some(false));

        let by_name = ThreadFilter { names: vec!["worker-*".into()], ..Default::default() };
        assert_eq!(by_name.decide(pid, Some(101), NameKnown::Known(Some("worker-3"))), Some(true));
        assert_eq!(by_name.decide(pid, Some(101), NameKnown::Known(Some("MainThread"))), Some(false));
        assert_eq!(by_name.decide(pid, Some(101), NameKnown::Known(None)), Some(false));
        assert_eq!(by_name.decide(pid, Some(101), NameKnown::Unknown), None);

        // Any criterion selects: a TID match needs no name.
        let both = ThreadFilter { names: vec!["worker-*".into()], tids: vec![101], main: false };
        assert_eq!(both.decide(pid, Some(101), NameKnown::Unknown), Some(true));
        assert_eq!(both.decide(pid, Some(102), NameKnown::Unknown), None);
    }
}

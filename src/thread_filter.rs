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
    pub names: Vec<NameGlob>,
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
                Selector::Name(n) => f.names.push(NameGlob::new(n)),
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
                NameKnown::Known(Some(n)) if self.names.iter().any(|g| g.matches(n)) => return Some(true),
                NameKnown::Known(_) => {}
                NameKnown::Unknown => undecided = true,
            }
        }
        if undecided { None } else { Some(false) }
    }

    /// The options that made this filter, for messages.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.names.iter().map(|n| format!("--thread {:?}", n.as_str())).collect();
        parts.extend(self.tids.iter().map(|t| format!("--thread {t}")));
        if self.main {
            parts.push("--main-thread".into());
        }
        parts.join(" ")
    }
}

/// A `--thread` name glob, compiled once: [`ThreadFilter::decide`] matches
/// it against threads at every sample that has one undecided.
///
/// `glob::Pattern` (rust-lang's `glob` crate) has the shell's rules the
/// option documents and nothing more: no `{a,b}` and no `\` escapes, which
/// `globset` would add and so change what a name with those characters
/// selects. Two of its refusals are read the shell's way instead: a run of
/// `*` is one `*` (`**` means directories to it, nothing to a thread name),
/// and a `[` that opens no class is itself.
#[derive(Debug, Clone)]
pub struct NameGlob {
    text: String,
    /// None: not a glob even so; the text is matched literally.
    pattern: Option<glob::Pattern>,
}

impl NameGlob {
    pub fn new(text: &str) -> NameGlob {
        NameGlob { text: text.to_string(), pattern: compile(text) }
    }

    /// Whether `name` matches as a whole.
    pub fn matches(&self, name: &str) -> bool {
        match &self.pattern {
            Some(p) => p.matches(name),
            None => self.text == name,
        }
    }

    /// As given on the command line.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for NameGlob {
    fn eq(&self, other: &NameGlob) -> bool {
        self.text == other.text
    }
}

impl Eq for NameGlob {}

fn compile(text: &str) -> Option<glob::Pattern> {
    let mut chars: Vec<char> = Vec::with_capacity(text.len());
    for c in text.chars() {
        if !(c == '*' && chars.last() == Some(&'*')) {
            chars.push(c);
        }
    }
    // Each retry turns one unclosed `[` into the class `[[]`: at most one
    // retry per character.
    for _ in 0..=chars.len() {
        match glob::Pattern::new(&chars.iter().collect::<String>()) {
            Ok(p) => return Some(p),
            Err(e) if chars.get(e.pos) == Some(&'[') => {
                chars.splice(e.pos..=e.pos, ['[', '[', ']']);
            }
            Err(_) => return None,
        }
    }
    None
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
            // What glob refuses is read as a shell reads it.
            ("a[*", "a[xyz"),
            ("[!]", "[!]"),
            ("w**r", "worker"),
            ("**", "any/thing"),
        ] {
            assert!(NameGlob::new(glob).matches(name), "{glob} should match {name}");
        }
        for (glob, name) in [("worker", "worker-1"), ("worker-*", "worker"), ("?", ""), ("pool-[0-9]", "pool-x"), ("pool-[!0-9]", "pool-1"), ("*a*b*c", "abcx")]
        {
            assert!(!NameGlob::new(glob).matches(name), "{glob} should not match {name}");
        }
        // Backtracking stays linear in practice: a long name of near misses.
        let name = "a".repeat(4096);
        assert!(!NameGlob::new("*a*a*a*a*b").matches(&name));
    }

    #[test]
    fn parse_tells_tids_from_names() {
        let f = ThreadFilter::parse(&["worker-*".into(), "1234".into(), "[1]23".into()], true).unwrap();
        assert_eq!(f, ThreadFilter { names: vec![NameGlob::new("worker-*"), NameGlob::new("[1]23")], tids: vec![1234], main: true });
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

        let by_name = ThreadFilter { names: vec![NameGlob::new("worker-*")], ..Default::default() };
        assert_eq!(by_name.decide(pid, Some(101), NameKnown::Known(Some("worker-3"))), Some(true));
        assert_eq!(by_name.decide(pid, Some(101), NameKnown::Known(Some("MainThread"))), Some(false));
        assert_eq!(by_name.decide(pid, Some(101), NameKnown::Known(None)), Some(false));
        assert_eq!(by_name.decide(pid, Some(101), NameKnown::Unknown), None);

        // Any criterion selects: a TID match needs no name.
        let both = ThreadFilter { names: vec![NameGlob::new("worker-*")], tids: vec![101], main: false };
        assert_eq!(both.decide(pid, Some(101), NameKnown::Unknown), Some(true));
        assert_eq!(both.decide(pid, Some(102), NameKnown::Unknown), None);
    }

    /// What a name glob costs the sample that judges a thread with it
    /// (every thread of every sample while it is undecided): run with
    /// `cargo test --release --lib match_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn match_cost() {
        let names: Vec<String> = (0..64).map(|i| if i % 2 == 0 { format!("worker-{i}") } else { format!("ThreadPoolExecutor-0_{i}") }).collect();
        let filter = ThreadFilter::new(&[Selector::Name("worker-*".into())], false);
        let rounds = 20_000;
        let t = std::time::Instant::now();
        let mut hits = 0;
        for _ in 0..rounds {
            for n in &names {
                hits += usize::from(filter.decide(None, Some(1), NameKnown::Known(Some(std::hint::black_box(n)))) == Some(true));
            }
        }
        let per = t.elapsed().as_nanos() as f64 / (rounds * names.len()) as f64;
        println!("{per:.1} ns per decision by name glob");
        assert_eq!(hits, rounds * names.iter().filter(|n| n.starts_with("worker-")).count());
    }
}

//! `--subprocesses`: descendants of the recorded process, attached once
//! they run Python (a child may exec its interpreter a little later).

use std::collections::HashMap;

use crate::attach::AttachOptions;
use crate::process::descendants;
use crate::sampler::Discover;
use crate::session::Session;

/// Attempts per child before it is taken for a program that is not Python.
const MAX_TRIES: u32 = 20;

pub struct ChildFinder {
    roots: Vec<i32>,
    opts: AttachOptions,
    /// pid → failed attach attempts.
    tried: HashMap<i32, u32>,
}

impl ChildFinder {
    pub fn new(root: i32, opts: AttachOptions) -> ChildFinder {
        ChildFinder { roots: vec![root], opts, tried: HashMap::new() }
    }
}

impl Discover for ChildFinder {
    fn poll(&mut self, sessions: &mut Vec<Session>) {
        for pid in descendants(&self.roots) {
            if sessions.iter().any(|s| s.pid() == pid) {
                continue;
            }
            let tries = self.tried.entry(pid).or_insert(0);
            if *tries >= MAX_TRIES {
                continue;
            }
            *tries += 1;
            if let Ok(s) = Session::attach(pid, &self.opts) {
                sessions.push(s);
            }
        }
    }
}

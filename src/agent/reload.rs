//! SIGHUP: read the certificate, key and token files again (as nginx and
//! sshd do), or, with nothing to reload, stop as SIGTERM does. SIGHUP is
//! blocked in every thread and taken by one that waits for it, so it
//! never interrupts the sampler's sleeps and waits.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use nix::sys::signal::{SigSet, Signal};

use super::auth::Token;
use super::tls::Tls;

fn sighup() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGHUP);
    set
}

/// Blocks SIGHUP in the calling thread, and so in every thread it starts
/// after: call it before the agent starts any.
pub fn hold_sighup() {
    let _ = sighup().thread_block();
}

/// What SIGHUP reloads.
pub struct Reloadable {
    pub tls: Option<Arc<Tls>>,
    pub token: Option<Arc<Token>>,
}

/// Waits for SIGHUP on a thread of its own, for ever.
pub fn spawn(what: Reloadable) -> std::io::Result<()> {
    std::thread::Builder::new().name("pyprof-sighup".into()).spawn(move || {
        let set = sighup();
        while set.wait().is_ok() {
            on_sighup(&what);
        }
    })?;
    Ok(())
}

fn on_sighup(what: &Reloadable) {
    let from_file = what.token.as_ref().is_some_and(|t| t.is_from_file());
    if what.tls.is_none() && !from_file {
        crate::sampler::STOP.store(true, Ordering::SeqCst);
        return;
    }
    // One line each; a failed reload keeps what was in force.
    if let Some(tls) = &what.tls {
        match tls.reload() {
            Ok(()) => eprintln!("pyprof agent: SIGHUP: certificate reloaded"),
            Err(e) => eprintln!("pyprof agent: SIGHUP: keeping the certificate in force: {e:#}"),
        }
    }
    if let Some(token) = what.token.as_ref().filter(|t| t.is_from_file()) {
        match token.reload() {
            Ok(()) => eprintln!("pyprof agent: SIGHUP: token reloaded"),
            Err(e) => eprintln!("pyprof agent: SIGHUP: keeping the token in force: {e:#}"),
        }
    }
}

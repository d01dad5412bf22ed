//! What the agent's sampling side hands to its exporters: one target's
//! samples over one interval, with the labels every backend is given. The
//! pull side (`/debug/pprof/profile`) and the push side (Pyroscope ingest,
//! OTLP) both start from this, so neither knows how the other collects.

use std::time::SystemTime;

use crate::profile::model::Profile;

/// Who a profile is about. Backends key series by these.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetLabels {
    pub pid: i32,
    /// `--service`, else a name taken from the process's command line.
    pub service: String,
    /// The command line, joined with spaces.
    pub command: String,
    /// X.Y.Z as read from the target.
    pub python_version: String,
    pub host: String,
    /// `--label k=v`, in the order given.
    pub extra: Vec<(String, String)>,
}

impl TargetLabels {
    /// Every label as (key, value), the fixed ones first: what Pyroscope's
    /// `name=service{...}` and OTLP resource attributes are built from.
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut out = vec![
            ("service_name".to_string(), self.service.clone()),
            ("host".to_string(), self.host.clone()),
            ("pid".to_string(), self.pid.to_string()),
            ("command".to_string(), self.command.clone()),
            ("python_version".to_string(), self.python_version.clone()),
        ];
        out.extend(self.extra.iter().cloned());
        out
    }
}

/// One target's samples between `from` and `until`, at `rate_hz` (the rate
/// the agent ran at over that interval, which its CPU budget may lower).
#[derive(Debug, Clone)]
pub struct Interval {
    pub labels: TargetLabels,
    pub profile: Profile,
    pub from: SystemTime,
    pub until: SystemTime,
    pub rate_hz: f64,
}

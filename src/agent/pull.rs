//! A pull request's profile as Go's net/http/pprof serves one: the gzipped
//! pprof protobuf, each sample labelled with its process's `pid` (pprof's
//! writer adds it) and `service`, so a scraper that reads many targets
//! from one endpoint can split them again.

use std::collections::HashMap;
use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use super::window::Pulled;
use crate::output::pprof::{build, proto};

pub fn render(p: &Pulled) -> anyhow::Result<Vec<u8>> {
    let mut msg = build(&p.profile);
    label_services(&mut msg, &p.services);
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&msg.encode_to_vec())?;
    Ok(gz.finish()?)
}

fn intern(table: &mut Vec<String>, s: &str) -> i64 {
    match table.iter().position(|t| t == s) {
        Some(i) => i as i64,
        None => {
            table.push(s.to_string());
            table.len() as i64 - 1
        }
    }
}

/// Adds a `service` string label next to each sample's numeric `pid` label.
fn label_services(msg: &mut proto::Profile, services: &HashMap<i32, String>) {
    let Some(pid_key) = msg.string_table.iter().position(|s| s == "pid").map(|i| i as i64) else { return };
    let service_key = intern(&mut msg.string_table, "service");
    let mut ids: HashMap<i64, i64> = HashMap::new();
    for sample in &mut msg.sample {
        let Some(pid) = sample.label.iter().find(|l| l.key == pid_key).map(|l| l.num) else { continue };
        let Some(name) = services.get(&(pid as i32)) else { continue };
        let id = *ids.entry(pid).or_insert_with(|| intern(&mut msg.string_table, name));
        sample.label.push(proto::Label { key: service_key, str: id, ..Default::default() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::Profile;
    use std::io::Read;

    #[test]
    fn samples_carry_pid_and_service() {
        let pulled = Pulled { profile: Profile::example(), services: HashMap::from([(4242, "app".to_string())]) };
        let gz = render(&pulled).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        let msg = proto::Profile::decode(&raw[..]).unwrap();
        let s = |i: i64| msg.string_table[i as usize].as_str();
        for sample in &msg.sample {
            let labels: Vec<(&str, &str, i64)> = sample.label.iter().map(|l| (s(l.key), s(l.str), l.num)).collect();
            assert!(labels.contains(&("pid", "", 4242)), "{labels:?}");
            assert!(labels.contains(&("service", "app", 0)), "{labels:?}");
        }
    }
}

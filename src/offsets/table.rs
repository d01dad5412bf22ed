//! The per-version data files under `offsets/`, embedded at build time so the
//! binary is self-contained. See `offsets/README.md` for the schema.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{CodeCounter, Constants, FieldMap, FrameChain, InstanceDict, LastiUnit, Layout, LineTableKind, Rules};

const FILES: &[(u32, &str)] = &[
    (8, include_str!("../../offsets/cpython-3.8.toml")),
    (9, include_str!("../../offsets/cpython-3.9.toml")),
    (10, include_str!("../../offsets/cpython-3.10.toml")),
    (11, include_str!("../../offsets/cpython-3.11.toml")),
    (12, include_str!("../../offsets/cpython-3.12.toml")),
    (13, include_str!("../../offsets/cpython-3.13.toml")),
    (14, include_str!("../../offsets/cpython-3.14.toml")),
    (15, include_str!("../../offsets/cpython-3.15.toml")),
];

pub fn supported_minors() -> impl Iterator<Item = u32> {
    FILES.iter().map(|&(m, _)| m)
}

/// One parsed `cpython-3.X.toml`.
#[derive(Debug, Clone)]
pub struct VersionFile {
    pub minor: u32,
    pub provenance: String,
    pub layout: Layout,
    pub rules: Rules,
    /// Offsets carried by the file (for 3.13+, only what `_Py_DebugOffsets` lacks).
    pub fields: FieldMap,
    pub constants: Constants,
    /// 3.13+: names of the u64 words after the cookie of `_Py_DebugOffsets`, in order.
    pub debug_fields: Option<Vec<String>>,
    /// 3.13+: the values a default build's headers give those words: for
    /// unit tests, which have no target to read them from.
    pub debug_defaults: Option<Vec<u64>>,
}

pub fn for_minor(minor: u32) -> Option<Result<VersionFile, String>> {
    FILES.iter().find(|&&(m, _)| m == minor).map(|&(m, text)| parse(m, text))
}

/// A file as serde reads it: the words that say how the version behaves
/// are typed and checked here (an unknown or a missing one is an error that
/// names it); every other table is `[struct] field = offset`.
#[derive(Deserialize)]
struct FileToml {
    provenance: Provenance,
    #[serde(with = "LayoutDef")]
    layout: Layout,
    #[serde(with = "RulesDef")]
    rules: Rules,
    #[serde(default)]
    constants: BTreeMap<String, i64>,
    debug_offsets: Option<DebugOffsetsToml>,
    #[serde(flatten)]
    structs: BTreeMap<String, toml::Table>,
}

/// `[provenance]`: where the numbers come from. Other keys are notes for
/// people (how to regenerate, how it was verified).
#[derive(Deserialize)]
pub(super) struct Provenance {
    pub(super) python: String,
    pub(super) source: String,
    pub(super) applies_to: String,
}

impl Provenance {
    pub(super) fn summary(&self) -> String {
        format!("python: {}; source: {}; applies_to: {}", self.python, self.source, self.applies_to)
    }
}

#[derive(Deserialize)]
#[serde(remote = "Layout", deny_unknown_fields)]
struct LayoutDef {
    #[serde(with = "FrameChainDef")]
    frame: FrameChain,
    #[serde(with = "LineTableKindDef")]
    linetable: LineTableKind,
    #[serde(with = "LastiUnitDef")]
    lasti: LastiUnit,
    /// Optional: without it the walker works and thread names are off.
    #[serde(default, deserialize_with = "instance_dict")]
    instance_dict: Option<InstanceDict>,
}

#[derive(Deserialize)]
#[serde(remote = "FrameChain", rename_all = "snake_case")]
enum FrameChainDef {
    FrameObject,
    InterpreterFrame,
}

#[derive(Deserialize)]
#[serde(remote = "LineTableKind", rename_all = "snake_case")]
enum LineTableKindDef {
    Lnotab,
    #[serde(rename = "linetable")]
    Linetable310,
    Locations,
}

#[derive(Deserialize)]
#[serde(remote = "LastiUnit", rename_all = "snake_case")]
enum LastiUnitDef {
    Bytes,
    CodeUnits,
    InstrPtr,
}

#[derive(Deserialize)]
#[serde(remote = "InstanceDict", rename_all = "snake_case")]
enum InstanceDictDef {
    #[serde(rename = "dictoffset")]
    DictOffset,
    ManagedValuesPreheader,
    ManagedTaggedPreheader,
    InlineValues,
}

fn instance_dict<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<InstanceDict>, D::Error> {
    InstanceDictDef::deserialize(d).map(Some)
}

/// `[rules]`: every rule stated, none unknown. A file that does not say how
/// its version behaves is refused rather than read with guesses.
#[derive(Deserialize)]
#[serde(remote = "Rules", deny_unknown_fields)]
struct RulesDef {
    frame_objects_recycled: bool,
    eval_call_per_frame: bool,
    entry_frame_flagged: bool,
    entry_shim_frames: bool,
    /// Stated always; "" for a version without shim frames.
    #[serde(deserialize_with = "empty_is_none")]
    shim_code_name: Option<String>,
    caller_stacktop: bool,
    popped_executable_cleared: bool,
    incomplete_frames_hidden: bool,
    current_frame_in_cframe: bool,
    #[serde(with = "CodeCounterDef")]
    code_counter: CodeCounter,
}

#[derive(Deserialize)]
#[serde(remote = "CodeCounter", rename_all = "snake_case")]
enum CodeCounterDef {
    None,
    Frees,
    Versions,
}

fn empty_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(|s| Some(s).filter(|s| !s.is_empty()))
}

/// `[debug_offsets]` (3.13+): the layout of `_Py_DebugOffsets`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DebugOffsetsToml {
    #[serde(rename = "cookie")]
    _cookie: String,
    size: u64,
    fields: Vec<String>,
    header_defaults: Option<Vec<u64>>,
}

/// toml's message on one line, with the file, and the line it points at
/// (which names the key, or the table a key is missing from).
pub(super) fn toml_error(file: &str, text: &str, e: &toml::de::Error) -> String {
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else { return format!("{file}: {}", e.message().trim()) };
    let line = text[..at].matches('\n').count() + 1;
    let src = text.lines().nth(line - 1).unwrap_or("");
    let src = src.split_once(" #").map_or(src, |(code, _)| code).trim();
    format!("{file}, line {line} ({src}): {}", e.message().trim())
}

pub fn parse(minor: u32, text: &str) -> Result<VersionFile, String> {
    let name = format!("cpython-3.{minor}.toml");
    let doc: FileToml = toml::from_str(text).map_err(|e| toml_error(&name, text, &e))?;
    let mut fields = FieldMap::new();
    for (section, table) in &doc.structs {
        for (k, v) in table {
            let shown = v.as_integer().map_or_else(|| format!("a {}", v.type_str()), |n| n.to_string());
            let n = v.as_integer().and_then(|n| u64::try_from(n).ok()).ok_or(format!("{name}: {section}.{k} = {shown} is not an offset"))?;
            fields.insert(format!("{section}.{k}"), n);
        }
    }
    // Constants also as fields, so Offsets::build sees them the same way
    // from a file and from the 3.13+ merged map.
    for (k, &n) in &doc.constants {
        if let Ok(n) = u64::try_from(n) {
            fields.insert(format!("constants.{k}"), n);
        }
    }
    let (debug_fields, debug_defaults) = match doc.debug_offsets {
        Some(d) if d.size != 8 + 8 * d.fields.len() as u64 => {
            return Err(format!("{name}: [debug_offsets] size {} is not 8 + 8 × {} fields", d.size, d.fields.len()));
        }
        Some(d) => (Some(d.fields), d.header_defaults),
        None => (None, None),
    };
    let owner = |k: &str| doc.constants.get(k).and_then(|&v| u8::try_from(v).ok());
    let constants = Constants {
        first_non_python_owner: [owner("frame_owned_by_cstack"), owner("frame_owned_by_interpreter")].into_iter().flatten().min(),
        executable_tag_mask: doc.constants.get("executable_tag_mask").copied().unwrap_or(0) as u64,
        generator_owner: owner("frame_owned_by_generator"),
    };
    Ok(VersionFile { minor, provenance: doc.provenance.summary(), layout: doc.layout, rules: doc.rules, fields, constants, debug_fields, debug_defaults })
}

/// The offsets a default build of 3.`minor` has, without a target: the file,
/// plus for 3.13+ its `header_defaults` for the `_Py_DebugOffsets` words.
#[cfg(test)]
pub(crate) fn offsets_for_tests(minor: u32) -> super::Offsets {
    let file = for_minor(minor).unwrap().unwrap();
    let mut fields = file.fields.clone();
    if let Some(names) = &file.debug_fields {
        let values = file.debug_defaults.as_ref().expect("header_defaults");
        assert_eq!(names.len(), values.len(), "3.{minor}: one default per debug field");
        fields.extend(names.iter().cloned().zip(values.iter().copied()));
    }
    let v = crate::binary::version::PythonVersion { major: 3, minor, patch: 0, release: String::new() };
    super::Offsets::build(v, file.layout, file.rules.clone(), &fields, file.constants.clone(), file.provenance.clone())
        .unwrap_or_else(|e| panic!("3.{minor}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_file_parses_and_builds() {
        for minor in supported_minors() {
            let file = for_minor(minor).unwrap().unwrap();
            if let Some(debug_fields) = &file.debug_fields {
                assert!(debug_fields.len() > 20, "3.{minor}");
            } else {
                let v = crate::binary::version::PythonVersion { major: 3, minor, patch: 0, release: String::new() };
                super::super::Offsets::build(v, file.layout, file.rules.clone(), &file.fields, file.constants.clone(), file.provenance.clone())
                    .unwrap_or_else(|e| panic!("3.{minor}: {e}"));
            }
        }
    }

    /// Every number a file states reaches the parsed file: each `[struct]
    /// field = offset` as "struct.field", each constant as
    /// "constants.NAME", and nothing else. Read with a plain TOML table,
    /// independently of the parser.
    #[test]
    fn every_number_of_every_file_is_read() {
        for &(minor, text) in FILES {
            let file = for_minor(minor).unwrap().unwrap();
            let doc: toml::Table = text.parse().unwrap();
            let mut want = FieldMap::new();
            for (section, table) in doc.iter().filter(|(s, _)| !matches!(s.as_str(), "provenance" | "layout" | "rules" | "debug_offsets")) {
                for (k, v) in table.as_table().unwrap() {
                    want.insert(format!("{section}.{k}"), u64::try_from(v.as_integer().unwrap()).unwrap());
                }
            }
            assert_eq!(file.fields, want, "3.{minor}");
            let debug = doc.get("debug_offsets");
            let strings = |k: &str| debug.map(|d| d[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect::<Vec<_>>());
            assert_eq!(file.debug_fields, strings("fields"), "3.{minor}");
            let words = debug.map(|d| d["header_defaults"].as_array().unwrap().iter().map(|v| v.as_integer().unwrap() as u64).collect::<Vec<_>>());
            assert_eq!(file.debug_defaults, words, "3.{minor}");
            let stated = |k: &str| doc["provenance"][k].as_str().unwrap().to_string();
            assert!(file.provenance.contains(&stated("source")) && file.provenance.contains(&stated("applies_to")), "3.{minor}");
        }
    }

    /// Bad files are refused with the file, the line and the key named.
    #[test]
    fn bad_files_name_the_file_and_the_key() {
        let text = FILES.iter().find(|f| f.0 == 12).unwrap().1;
        let err = |t: &str| parse(12, t).unwrap_err();
        let unknown = err(&text.replace("[rules]\n", "[rules]\nframes_are_fast = true\n"));
        assert!(unknown.starts_with("cpython-3.12.toml, line ") && unknown.contains("unknown field `frames_are_fast`"), "{unknown}");
        assert!(!unknown.contains('\n'), "{unknown}");
        let missing = err(&text.replace("code_counter = \"versions\"", ""));
        assert!(missing.contains("cpython-3.12.toml") && missing.contains("missing field `code_counter`") && missing.contains("[rules]"), "{missing}");
        let word = err(&text.replace("frame = \"interpreter_frame\"", "frame = \"linked_list\""));
        assert!(word.contains("unknown variant `linked_list`") && word.contains("frame = \"linked_list\""), "{word}");
        let negative = err(&text.replace("interpreters_head = 40", "interpreters_head = -40"));
        assert!(negative.contains("runtime_state.interpreters_head = -40"), "{negative}");
        let layout = err(&text.replace("[layout]\n", "[layout]\nframes = \"x\"\n"));
        assert!(layout.contains("unknown field `frames`"), "{layout}");
    }

    /// Representative words of `[layout]` and `[rules]`, one version per shape.
    #[test]
    fn layout_and_rules_words_are_read() {
        let f8 = for_minor(8).unwrap().unwrap();
        assert_eq!((f8.layout.frame, f8.layout.linetable, f8.layout.lasti), (FrameChain::FrameObject, LineTableKind::Lnotab, LastiUnit::Bytes));
        assert_eq!(f8.layout.instance_dict, Some(InstanceDict::DictOffset));
        assert!(f8.rules.frame_objects_recycled && f8.rules.eval_call_per_frame && f8.rules.shim_code_name.is_none());
        assert_eq!(f8.rules.code_counter, CodeCounter::None);
        let f10 = for_minor(10).unwrap().unwrap();
        assert_eq!((f10.layout.linetable, f10.layout.lasti), (LineTableKind::Linetable310, LastiUnit::CodeUnits));
        let f12 = for_minor(12).unwrap().unwrap();
        assert_eq!((f12.layout.frame, f12.layout.linetable, f12.layout.lasti), (FrameChain::InterpreterFrame, LineTableKind::Locations, LastiUnit::InstrPtr));
        assert_eq!(f12.layout.instance_dict, Some(InstanceDict::ManagedTaggedPreheader));
        assert_eq!(f12.rules.shim_code_name.as_deref(), Some("<interpreter trampoline>"));
        assert!(f12.rules.entry_shim_frames && f12.rules.caller_stacktop && !f12.rules.frame_objects_recycled);
        assert_eq!(f12.rules.code_counter, CodeCounter::Versions);
        let f14 = for_minor(14).unwrap().unwrap();
        assert_eq!(f14.rules.code_counter, CodeCounter::Frees);
        assert_eq!(f14.layout.instance_dict, Some(InstanceDict::InlineValues));
        assert!(f14.constants.first_non_python_owner.is_some() && f14.constants.executable_tag_mask != 0);
    }

    /// Every file carries what thread names need: for 3.8–3.12 the file alone
    /// builds [`super::super::NameOffsets`]; for 3.13+ the file plus the
    /// `_Py_DebugOffsets` words its comments record (the header defaults).
    #[test]
    fn every_embedded_file_has_thread_name_offsets() {
        for minor in supported_minors() {
            assert!(for_minor(minor).unwrap().unwrap().layout.instance_dict.is_some(), "3.{minor}: [layout] instance_dict");
            assert!(offsets_for_tests(minor).names.is_some(), "3.{minor}: thread-name offsets incomplete");
        }
    }

    /// Every supported version can offer `<GC>` frames and `--mode
    /// exception` (3.13+ with the `_Py_DebugOffsets` words a default build carries).
    #[test]
    fn every_embedded_file_has_gc_and_exception_offsets() {
        use super::super::GcFlag;
        for minor in supported_minors() {
            let o = offsets_for_tests(minor);
            match o.gc {
                Some(GcFlag::Runtime(_)) => assert_eq!(minor, 8, "only 3.8 keeps its GC state in _PyRuntime"),
                Some(GcFlag::Interpreter(_)) => assert!(minor >= 9),
                None => panic!("3.{minor}: no GC flag"),
            }
            assert!(o.exception.is_some(), "3.{minor}: no exception offsets");
        }
    }

    /// A file (or target) without the fields, or with implausible ones,
    /// still attaches: the features are off, not guessed.
    #[test]
    fn missing_or_implausible_gc_and_exception_offsets_switch_them_off() {
        let file = for_minor(12).unwrap().unwrap();
        let v = crate::binary::version::PythonVersion { major: 3, minor: 12, patch: 0, release: String::new() };
        let build = |fields: &FieldMap| {
            super::super::Offsets::build(v.clone(), file.layout, file.rules.clone(), fields, file.constants.clone(), String::new()).unwrap()
        };
        let mut fields = file.fields.clone();
        fields.remove("thread_state.exc_info");
        fields.insert("gc.collecting".into(), 1 << 20);
        let o = build(&fields);
        assert!(o.gc.is_none() && o.exception.is_none());
        fields.insert("gc.collecting".into(), file.fields["gc.collecting"]);
        fields.insert("interpreter_state.gc".into(), file.fields["interpreter_state.size"]);
        assert!(build(&fields).gc.is_none(), "a GC state past the end of the interpreter");
    }
}

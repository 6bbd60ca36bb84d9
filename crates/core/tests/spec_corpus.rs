//! The spec parser, specified by a corpus: every file in `bad_specs/` holds one mistake (a few hold
//! several, to prove all are reported) and its snapshot is the exact text a user would read; every
//! file in `good_specs/` must parse. Property tests throw random and mutated text at the parser.

use proptest::prelude::*;
use tidegate_core::spec::{EXAMPLE, parse};

/// The corpus files of `folder` (beside this file), sorted, as (file name, text). Read by hand
/// rather than with `insta::glob!`: its `glob` feature pulls in `globset`, whose features for
/// `regex-automata` differ from the binary's, so `cargo test` after `cargo run` would rebuild the
/// whole DataFusion stack (decision 0003).
fn corpus(folder: &str) -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(folder);
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("the corpus folder is readable")
        .map(|entry| entry.expect("a corpus entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .map(|path| {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            (name, std::fs::read_to_string(&path).expect("corpus files are readable UTF-8"))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus files in {}", dir.display());
    files
}

#[test]
fn bad_specs_report_clear_diagnostics() {
    for (name, text) in corpus("bad_specs") {
        match parse(&name, &text) {
            Ok(_) => panic!("{name} should be rejected"),
            Err(diags) => {
                assert!(diags.0.iter().all(|d| d.file == name && d.line >= 1 && d.col >= 1));
                insta::with_settings!({ snapshot_suffix => name.clone(), input_file => format!("tests/bad_specs/{name}") }, {
                    insta::assert_snapshot!(diags.to_string());
                });
            }
        }
    }
}

#[test]
fn good_specs_parse() {
    for (name, text) in corpus("good_specs") {
        if let Err(diags) = parse(&name, &text) {
            panic!("{name} should parse, got:\n{diags}");
        }
    }
}

#[test]
fn a_minimal_spec_fills_in_every_default() {
    let text = include_str!("good_specs/minimal.toml");
    let mut spec = parse("minimal.toml", text).expect("minimal.toml is valid");
    assert_eq!(spec.hash, blake3::hash(text.as_bytes()).to_hex().to_string());
    // The hash changes with every edit of the file; the snapshot is about the model.
    spec.hash = "[blake3 of the text]".to_owned();
    insta::assert_json_snapshot!(spec);
}

/// Offsets into the example at which a mutation is applied, and what is done there.
#[derive(Debug, Clone)]
enum Mutation {
    Delete { at: usize, len: usize },
    Insert { at: usize, text: String },
    Truncate { at: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop_oneof![
        Just("\"".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("{".to_owned()),
        Just("=".to_owned()),
        Just("\n".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("é".to_owned()),
        Just("[[tasks.x.inputs]]\n".to_owned()),
        Just("a.b = 1\n".to_owned()),
        "\\PC{0,8}",
    ];
    prop_oneof![
        (any::<usize>(), 1usize..40).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), interesting).prop_map(|(at, text)| Mutation::Insert { at, text }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ]
}

/// Applies a mutation at the nearest character boundary, so the result is still a `&str`.
fn apply(text: &str, m: &Mutation) -> String {
    let boundary = |at: usize| {
        let mut at = at % (text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        at
    };
    match m {
        Mutation::Delete { at, len } => {
            let start = boundary(*at);
            let end = boundary((start + len).min(text.len()));
            format!("{}{}", &text[..start], &text[end.max(start)..])
        }
        Mutation::Insert { at, text: ins } => {
            let at = boundary(*at);
            format!("{}{ins}{}", &text[..at], &text[at..])
        }
        Mutation::Truncate { at } => text[..boundary(*at)].to_owned(),
    }
}

/// Lines that are valid TOML on their own, over a tiny alphabet of keys, so that random files
/// exercise table redefinitions, dotted keys and arrays of tables rather than only syntax errors.
fn toml_line() -> impl Strategy<Value = String> {
    let key = prop_oneof![Just("a"), Just("b"), Just("tasks"), Just("datasets"), Just("x")];
    let path = prop::collection::vec(key, 1..4).prop_map(|k| k.join("."));
    let value = prop_oneof![
        Just("1".to_owned()),
        Just("\"s\"".to_owned()),
        Just("[\"a\", \"b\"]".to_owned()),
        Just("{ a = 1, b.x = \"y\" }".to_owned()),
        Just("[{ a = 1 }, { b = 2 }]".to_owned()),
        Just("true".to_owned()),
    ];
    prop_oneof![
        path.clone().prop_map(|p| format!("[{p}]")),
        path.clone().prop_map(|p| format!("[[{p}]]")),
        (path, value).prop_map(|(p, v)| format!("{p} = {v}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn parse_never_panics_on_random_text(text in "\\PC{0,200}") {
        let _ = parse("random.toml", &text);
    }

    #[test]
    fn parse_never_panics_on_toml_shaped_text(lines in prop::collection::vec(toml_line(), 0..12)) {
        let _ = parse("shaped.toml", &lines.join("\n"));
    }

    #[test]
    fn parse_never_panics_on_mutated_examples(mutations in prop::collection::vec(mutation(), 1..6)) {
        let text = mutations.iter().fold(EXAMPLE.to_owned(), |t, m| apply(&t, m));
        if let Err(diags) = parse("mutated.toml", &text) {
            prop_assert!(!diags.0.is_empty());
            let lines = text.lines().count() as u32 + 1;
            prop_assert!(diags.0.iter().all(|d| d.line >= 1 && d.line <= lines.max(1) && d.col >= 1), "{}", diags);
        }
    }
}

/// A pool's windows give it their slots while they hold, in the pool's zone; outside them the
/// pool has its own.
#[test]
fn pool_windows_hold_in_the_pools_zone() {
    let spec = parse("pool_windows.toml", include_str!("good_specs/pool_windows.toml")).expect("valid");
    let pool = &spec.pools["warehouse"];
    let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).expect("an instant").with_timezone(&chrono::Utc);
    // Wednesday 2024-01-03: Paris is UTC+1 in winter.
    assert_eq!(pool.slots_at(at("2024-01-03T07:59:00Z")), 8, "08:59 in Paris: before the window");
    assert_eq!(pool.slots_at(at("2024-01-03T08:00:00Z")), 2, "09:00 in Paris: the window holds");
    assert_eq!(pool.slots_at(at("2024-01-03T16:59:59Z")), 2, "17:59:59 in Paris");
    assert_eq!(pool.slots_at(at("2024-01-03T17:00:00Z")), 8, "18:00 in Paris: it ended");
    // Sunday 2024-01-07 all day in Paris, which begins at 23:00 UTC on Saturday.
    assert_eq!(pool.slots_at(at("2024-01-06T23:00:00Z")), 0, "Sunday 00:00 in Paris");
    assert_eq!(pool.slots_at(at("2024-01-06T22:59:00Z")), 8, "still Saturday in Paris");
    assert_eq!(pool.slots_at(at("2024-01-07T22:59:59Z")), 0, "Sunday 23:59:59 in Paris");
    assert_eq!(spec.pools["default"].slots_at(at("2024-01-03T08:00:00Z")), 4, "no windows: its slots");
}

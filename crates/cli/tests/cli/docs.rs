//! docs/cli.md is the command reference `tidegate man --markdown` prints from the command line's
//! definition, byte for byte: a command added, or a help text changed, without regenerating the
//! page fails here, with the command that regenerates it. The page also covers what `--help`
//! shows: every command a user can call, with its examples.

use std::path::Path;

use crate::common::tidegate;

/// The command that rewrites docs/cli.md, from the workspace's root (as the page itself says).
const REGENERATE: &str = "cargo run -- man --markdown > docs/cli.md";

/// What `tidegate man --markdown` prints, run in `dir`.
fn generated(dir: &Path) -> String {
    let out = tidegate(dir).args(["man", "--markdown"]).env_remove("TIDEGATE_SERVER").output().expect("runs");
    assert!(out.status.success(), "tidegate man --markdown failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("the reference is UTF-8")
}

#[test]
fn docs_cli_md_is_the_reference_the_binary_prints() {
    let dir = tempfile::tempdir().expect("temp dir");
    let generated = generated(dir.path());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if generated == checked_in {
        return;
    }
    let (mut new, mut old) = (generated.lines(), checked_in.lines());
    let mut line = 1;
    let difference = loop {
        match (new.next(), old.next()) {
            (Some(a), Some(b)) if a == b => line += 1,
            (a, b) => break format!("line {line}: docs/cli.md has {b:?}, the binary prints {a:?}"),
        }
    };
    panic!(
        "docs/cli.md is not the reference the command line's definition generates (first difference at \
         {difference}). Regenerate it from the workspace's root and commit it:\n\n    {REGENERATE}\n\n\
         (or `target/debug/tidegate man --markdown > docs/cli.md` with the binary this test built)"
    );
}

#[test]
fn the_reference_has_every_command_and_its_examples() {
    let dir = tempfile::tempdir().expect("temp dir");
    let page = generated(dir.path());
    let mut all = Vec::new();
    crate::output::commands(dir.path(), &[], &mut all);
    assert!(all.len() > 30, "the walk finds the commands: {}", all.len());
    for (path, help) in all {
        let title = ["tidegate".to_owned()].into_iter().chain(path).collect::<Vec<_>>().join(" ");
        let heading = format!("\n## {title}\n");
        let Some(start) = page.find(&heading) else { panic!("docs/cli.md has no section `{title}`") };
        let section = &page[start + heading.len()..];
        let section = section.split("\n## ").next().unwrap_or(section);
        let examples = help.split_once("Examples:\n").or_else(|| help.split_once("Start here:\n"));
        let (_, examples) = examples.unwrap_or_else(|| panic!("`{title} --help` has no examples"));
        for example in examples.lines().map(str::trim).filter(|l| !l.is_empty()) {
            assert!(section.contains(example), "the section `{title}` lacks the example {example:?}");
        }
    }
}

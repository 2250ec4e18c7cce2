//! Keeps docs/GUARANTEES.md true: every guarantee id has a section, every id the code cites
//! ("SPEC R4", "SPEC F1-F9") has one, every section names tests or says what is not yet
//! guaranteed, and every test it names exists (so a renamed or deleted test fails here).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn guarantees() -> String {
    std::fs::read_to_string(root().join("docs/GUARANTEES.md")).expect("docs/GUARANTEES.md")
}

/// Every id of the specification.
fn all_ids() -> Vec<String> {
    let groups = [('S', 14), ('L', 4), ('R', 12), ('F', 12), ('E', 9)];
    groups
        .iter()
        .flat_map(|&(g, n)| (1..=n).map(move |i| format!("{g}{i}")))
        .collect()
}

/// The `### ID` sections and their text.
fn sections(doc: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in doc.lines() {
        if let Some(id) = line.strip_prefix("### ") {
            out.push((id.trim().to_string(), String::new()));
        } else if line.starts_with("## ") {
            out.push((String::new(), String::new()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out.retain(|(id, _)| !id.is_empty());
    out
}

/// The ids one citation names: "R4", "F2, F3", "F1-F9", "S3-S8, S10", or a bare group "F".
fn cited_ids(citation: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let tokens: Vec<&str> = citation
        .split(|c: char| c == ',' || c.is_whitespace() || c == ')' || c == ';' || c == ':')
        .filter(|t| !t.is_empty())
        .collect();
    for token in tokens {
        let parse = |t: &str| -> Option<(char, u32)> {
            let mut chars = t.chars();
            let g = chars.next()?;
            if !"SLREF".contains(g) {
                return None;
            }
            let n: u32 = chars.as_str().trim_end_matches('.').parse().ok()?;
            Some((g, n))
        };
        match token.split_once('-') {
            Some((a, b)) => match (parse(a), parse(b)) {
                (Some((g, lo)), Some((h, hi))) if g == h => {
                    ids.extend((lo..=hi).map(|i| format!("{g}{i}")));
                }
                _ => break,
            },
            None => match parse(token) {
                Some((g, n)) => ids.push(format!("{g}{n}")),
                None => break,
            },
        }
    }
    ids
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_guarantee_has_a_section_with_tests_or_an_honest_not_yet() {
    let doc = guarantees();
    let sections = sections(&doc);
    let found: Vec<&str> = sections.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(found, all_ids(), "sections out of order or missing");
    for (id, text) in &sections {
        assert!(
            text.contains("Tests:") || text.contains("**Not yet"),
            "{id} names no tests and does not say it is not yet guaranteed"
        );
    }
}

#[test]
fn every_id_the_code_cites_resolves_to_a_section() {
    let doc = guarantees();
    let known: BTreeSet<String> = sections(&doc).into_iter().map(|(id, _)| id).collect();
    let mut files = Vec::new();
    for dir in ["src", "examples", "inspect/src", "tests"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut citations = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.match_indices("SPEC ") {
            let rest: String = text[at + 5..].chars().take(60).collect();
            let rest = rest.lines().next().unwrap_or("");
            for id in cited_ids(rest) {
                citations += 1;
                assert!(
                    known.contains(&id),
                    "{} cites SPEC {id}, which docs/GUARANTEES.md has no section for",
                    file.strip_prefix(root()).unwrap_or(&file).display()
                );
            }
        }
    }
    assert!(
        citations > 100,
        "the citation parser found only {citations}"
    );
}

#[test]
fn every_test_the_document_names_exists() {
    let doc = guarantees();
    let mut named = 0;
    let mut missing = Vec::new();
    for chunk in doc.split('`').skip(1).step_by(2) {
        let Some((file, test)) = chunk.split_once(".rs::") else {
            continue;
        };
        let path = root().join(format!("{file}.rs"));
        let Ok(source) = std::fs::read_to_string(&path) else {
            missing.push(chunk.to_string());
            continue;
        };
        let defined = source.match_indices(&format!("fn {test}")).any(|(at, m)| {
            !source[at + m.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
        });
        assert!(
            defined,
            "docs/GUARANTEES.md names {chunk}, which does not exist"
        );
        named += 1;
    }
    assert!(named > 100, "only {named} tests named");
}

#[test]
fn the_citation_parser_reads_every_form() {
    assert_eq!(cited_ids("R4) and more"), ["R4"]);
    assert_eq!(cited_ids("F2, F3)."), ["F2", "F3"]);
    assert_eq!(cited_ids("S3-S5, S10)"), ["S3", "S4", "S5", "S10"]);
    assert_eq!(cited_ids("F). Default"), Vec::<String>::new());
    assert_eq!(cited_ids("L4, off the entity's lock"), ["L4"]);
}

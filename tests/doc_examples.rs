//! Every public function of the types a user calls has a compiled example.
//!
//! Walks `src/`, finds the inherent `impl` blocks of [`CHECKED`] types and the definitions of
//! the checked traits, and fails, naming each item and where it is, when a public function
//! there (a method of a checked trait) has no `# Examples` section with a code block in its
//! doc comment. Items compiled only with a test feature (`test-hooks`, `fault-injection`) are
//! not part of the public API and are not checked. Rustdoc compiles and runs the examples.

use std::path::{Path, PathBuf};

/// The types and traits whose public functions must each carry an example.
const CHECKED: &[&str] = &[
    "Engine",
    "EngineBuilder",
    "StateMachine",
    "Store",
    "FileStore",
    "FileStoreBuilder",
    "MemoryStore",
    "Batch",
    "Warm",
    "Fence",
    "RevocationHandle",
    "SweeperHandle",
];

/// A public function of a checked type whose doc comment has no example.
#[derive(Debug, PartialEq, Eq)]
struct Missing {
    item: String,
    file: String,
    line: usize,
    why: &'static str,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}:{}): {}",
            self.item, self.file, self.line, self.why
        )
    }
}

#[test]
fn every_public_function_of_the_user_types_has_an_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        let (seen, lacking) = scan(&name, &text);
        checked += seen;
        missing.extend(lacking);
    }
    assert!(
        checked >= 100,
        "the scan found only {checked} public functions: has the source layout changed?"
    );
    assert!(
        missing.is_empty(),
        "{} of {checked} public functions lack a complete example:\n  {}",
        missing.len(),
        missing
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

/// Negative control: the scan finds a function without an example, in an inherent impl and in
/// a trait, and one whose example hides its set-up, and accepts one with a whole example; it
/// ignores other types, trait impls, private and test-feature functions, and braces inside
/// strings and comments.
#[test]
fn the_scan_names_a_function_without_an_example() {
    let src = r#####"
impl Engine<M> {
    /// Has one.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(true);
    /// ```
    pub fn documented(&self) {
        let _ = "{ unbalanced in a string";
        let _ = '{';
        // { in a comment
    }

    /// No example here.
    pub fn undocumented(&self) {}

    /// # Examples
    ///
    /// ```
    /// # let engine = hidden_setup();
    /// engine.hidden();
    /// ```
    pub fn hidden(&self) {}

    /// # Examples
    ///
    /// A heading without a code block is not an example.
    pub fn heading_only(&self) {}

    fn private(&self) {}

    pub(crate) fn internal(&self) {}

    /// Test only.
    #[cfg(feature = "test-hooks")]
    pub fn hook(&self) {}
}

impl Other {
    pub fn not_checked(&self) {}
}

impl Store for Other {
    fn get(&self) {}
}

pub trait StateMachine {
    /// No example.
    fn fresh(&self);
}
"#####;
    let (seen, missing) = scan("x.rs", src);
    let names: Vec<&str> = missing.iter().map(|m| m.item.as_str()).collect();
    assert_eq!(
        names,
        [
            "Engine::undocumented",
            "Engine::hidden",
            "Engine::heading_only",
            "StateMachine::fresh"
        ]
    );
    assert_eq!(seen, 5);
    assert_eq!(missing[0].line, 17);
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

/// What one block of the scan is: a checked type's inherent impl, a checked trait, or other.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block<'a> {
    Inherent(&'a str),
    Trait(&'a str),
    Other,
}

/// Scans one file: how many public functions of checked types it holds, and which of them
/// lack an example.
fn scan(file: &str, text: &str) -> (usize, Vec<Missing>) {
    let lines: Vec<&str> = text.lines().collect();
    let stripped = strip(text);
    let codes: Vec<&str> = stripped.split('\n').collect();
    let mut depth = 0usize;
    let mut block: Option<(Block<'_>, usize)> = None;
    let mut seen = 0;
    let mut missing = Vec::new();
    for (i, code) in codes.iter().enumerate() {
        let trimmed = code.trim_start();
        if block.is_none() && code.contains('{') {
            let kind = block_kind(trimmed);
            if kind != Block::Other {
                block = Some((kind, depth));
            }
        }
        if let Some((kind, at)) = block
            && depth == at + 1
            && let Some(name) = function(kind, trimmed)
        {
            let owner = match kind {
                Block::Inherent(t) | Block::Trait(t) => t,
                Block::Other => unreachable!(),
            };
            let (docs, test_only) = preamble(&lines[..i]);
            if !test_only {
                seen += 1;
                let why = if !has_example(&docs) {
                    Some("no `# Examples` section with a code block")
                } else if hides_setup(&docs) {
                    Some("the example hides lines other than `fn main` and its `Ok(())`")
                } else {
                    None
                };
                if let Some(why) = why {
                    missing.push(Missing {
                        item: format!("{owner}::{name}"),
                        file: file.to_string(),
                        line: i + 1,
                        why,
                    });
                }
            }
        }
        for c in code.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if block.is_some_and(|(_, at)| depth == at) {
                        block = None;
                    }
                }
                _ => {}
            }
        }
    }
    assert_eq!(depth, 0, "{file}: the scan lost track of braces");
    (seen, missing)
}

/// Which block a line that opens one starts.
fn block_kind(line: &str) -> Block<'static> {
    let words: Vec<&str> = line
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    let checked = |w: &str| CHECKED.iter().copied().find(|c| *c == w);
    if line.starts_with("pub trait ") {
        if let Some(name) = words.get(2).copied().and_then(checked) {
            return Block::Trait(name);
        }
    } else if line.starts_with("impl") && !words.contains(&"for") {
        // `impl<M: StateMachine> Engine<M> {`: the type is the first word after the generics.
        let after_generics = match line.strip_prefix("impl<") {
            Some(rest) => close_generics(rest),
            None => line.strip_prefix("impl").unwrap_or(""),
        };
        let name = after_generics
            .trim_start()
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        if let Some(name) = checked(name) {
            return Block::Inherent(name);
        }
    }
    Block::Other
}

/// The rest of a line after the `>` that closes generics opened just before it.
fn close_generics(rest: &str) -> &str {
    let mut open = 1;
    for (i, c) in rest.char_indices() {
        match c {
            '<' => open += 1,
            '>' => {
                open -= 1;
                if open == 0 {
                    return &rest[i + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// The name of the function a line declares, if it is one the check covers.
fn function(kind: Block<'_>, line: &str) -> Option<String> {
    let rest = match kind {
        Block::Inherent(_) => line
            .strip_prefix("pub fn ")
            .or_else(|| line.strip_prefix("pub const fn ")),
        Block::Trait(_) => line.strip_prefix("fn "),
        Block::Other => None,
    }?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The doc comment above a declaration (its `///` lines), and whether an attribute there
/// compiles it only with a test feature.
fn preamble(above: &[&str]) -> (Vec<String>, bool) {
    let mut docs = Vec::new();
    let mut test_only = false;
    for line in above.iter().rev() {
        let t = line.trim_start();
        if let Some(doc) = t.strip_prefix("///") {
            docs.push(doc.trim_start().to_string());
        } else if t.starts_with("#[") {
            test_only |= t.contains("feature = \"test-hooks\"")
                || t.contains("feature = \"fault-injection\"")
                || t.contains("feature = \"etcd-test-hooks\"");
        } else {
            break;
        }
    }
    docs.reverse();
    (docs, test_only)
}

/// Whether a code block of a doc comment hides a line (`# ...`) other than the `main`
/// wrapper: an example shows its whole set-up.
fn hides_setup(docs: &[String]) -> bool {
    const ALLOWED: &[&str] = &[
        "# fn main() -> portcullis::Result<()> {",
        "# Ok(())",
        "# }",
        "# Ok::<(), portcullis::Error>(())",
    ];
    let mut in_code = false;
    docs.iter().any(|l| {
        if l.starts_with("```") {
            in_code = !in_code;
            return false;
        }
        let hidden = l == "#" || l.starts_with("# ");
        in_code && hidden && !ALLOWED.contains(&l.trim_end())
    })
}

/// Whether a doc comment has an `# Examples` heading followed by a code block.
fn has_example(docs: &[String]) -> bool {
    docs.iter()
        .position(|l| l.trim_end() == "# Examples")
        .is_some_and(|at| docs[at..].iter().any(|l| l.starts_with("```")))
}

/// The text with comments, string and character literals blanked (newlines kept), so braces
/// inside them do not count.
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                blank(&mut out, chars[i]);
                i += 1;
            }
            i += 2;
        } else if c == 'r' && (next == Some('#') || next == Some('"')) && !ident(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(&x) => blank(&mut out, x),
                }
                j += 1;
            }
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if let Some(&x) = chars.get(i) {
                    blank(&mut out, x);
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal ('{', '\n', '\''); a lifetime ('a) is left alone.
            i += if next == Some('\\') { 2 } else { 1 };
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the character at `i` continues an identifier (so an `r` there is no raw string).
fn ident(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

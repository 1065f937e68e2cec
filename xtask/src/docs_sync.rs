//! `cargo xtask docs-sync [--fix]`: the code blocks of README.md and
//! docs/*.md that show an example are that example's file, included, not
//! retyped.
//!
//! A line `<!-- example: PATH -->` directly before a fenced code block says
//! the block's content is the file at PATH (relative to the workspace
//! root); `<!-- example: PATH#name -->` says it is the region of that file
//! between a line holding `ANCHOR: name` and one holding `ANCHOR_END: name`
//! (in a comment: `// ANCHOR: name`), as mdBook includes. Lines holding
//! any `ANCHOR:` or `ANCHOR_END:` marker are left out of what is included.
//!
//! Without `--fix` each stale block is listed and the command fails; with
//! `--fix` the blocks are rewritten from the files.

use std::ops::Range;
use std::path::{Component, Path};

/// One marked code block of a markdown text.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    /// The marker's line, from 1.
    line: usize,
    /// The file it shows, relative to the workspace root.
    path: String,
    /// The region of the file, if not all of it.
    anchor: Option<String>,
    /// The bytes of the block's content in the markdown text: from after
    /// the opening fence's line to the start of the closing fence's line.
    content: Range<usize>,
}

/// `<!-- example: PATH[#anchor] -->` → (PATH, anchor).
fn marker(line: &str) -> Option<(&str, Option<&str>)> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim()
        .strip_prefix("example:")?
        .trim();
    if inner.is_empty() {
        return None;
    }
    Some(match inner.split_once('#') {
        Some((path, anchor)) => (path.trim(), Some(anchor.trim())),
        None => (inner, None),
    })
}

/// A fence line's character and length (three or more backticks or
/// tildes, indented at most three spaces).
fn fence(line: &str) -> Option<(char, usize)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let c = rest.chars().next().filter(|c| matches!(c, '`' | '~'))?;
    let n = rest.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((c, n))
}

/// Whether `line` closes a fence opened with `(c, n)`: the same character,
/// at least as many, nothing else but spaces.
fn closes(line: &str, (c, n): (char, usize)) -> bool {
    fence(line).is_some_and(|(c2, n2)| c2 == c && n2 >= n && line.trim().chars().all(|x| x == c))
}

/// The lines of `text` with the byte offset each starts at (the line
/// without its `\n`).
fn lines(text: &str) -> Vec<(usize, &str)> {
    let mut at = 0;
    text.split_inclusive('\n')
        .map(|l| {
            let start = at;
            at += l.len();
            (start, l.strip_suffix('\n').unwrap_or(l))
        })
        .collect()
}

/// Every marked block of `markdown`. A marker inside a code block is text,
/// not a marker; one not directly followed by a fence, or a fence never
/// closed, is an error naming its line.
fn blocks(markdown: &str) -> Result<Vec<Block>, String> {
    let lines = lines(markdown);
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let (_, line) = lines[i];
        if let Some(open) = fence(line) {
            // An unmarked block: skip it, markers in it are its text.
            i += 1;
            while i < lines.len() && !closes(lines[i].1, open) {
                i += 1;
            }
            i += 1;
            continue;
        }
        let Some((path, anchor)) = marker(line) else {
            i += 1;
            continue;
        };
        let at = i + 1;
        let Some(open) = lines.get(i + 1).and_then(|(_, l)| fence(l)) else {
            return Err(format!(
                "line {at}: an example marker not directly followed by a code block"
            ));
        };
        let start = lines.get(i + 2).map_or(markdown.len(), |(s, _)| *s);
        let mut j = i + 2;
        while j < lines.len() && !closes(lines[j].1, open) {
            j += 1;
        }
        let Some((end, _)) = lines.get(j) else {
            return Err(format!("line {at}: the example's code block is not closed"));
        };
        found.push(Block {
            line: at,
            path: path.to_owned(),
            anchor: anchor.map(str::to_owned),
            content: start..*end,
        });
        i = j + 1;
    }
    Ok(found)
}

/// `ANCHOR: name` / `ANCHOR_END: name` in a line: (is the end, name).
fn anchor_in(line: &str) -> Option<(bool, &str)> {
    let (end, rest) = match line.find("ANCHOR_END:") {
        Some(at) => (true, &line[at + "ANCHOR_END:".len()..]),
        None => (false, &line[line.find("ANCHOR:")? + "ANCHOR:".len()..]),
    };
    let name = rest.split_whitespace().next()?;
    Some((end, name.trim_end_matches("-->")))
}

/// What a block shows of `file`: all of it, or the region `anchor`, less
/// the anchor lines; every line ends with `\n`.
fn region(file: &str, anchor: Option<&str>) -> Result<String, String> {
    let mut out = String::new();
    let mut inside = anchor.is_none();
    let mut seen = false;
    for (_, line) in lines(file) {
        match (anchor_in(line), anchor) {
            (Some((false, name)), Some(want)) if name == want => {
                (inside, seen) = (true, true);
            }
            (Some((true, name)), Some(want)) if name == want && inside => {
                return Ok(out);
            }
            (Some(_), _) => {}
            (None, _) if inside => {
                out.push_str(line);
                out.push('\n');
            }
            (None, _) => {}
        }
    }
    match anchor {
        None => Ok(out),
        Some(name) if seen => Err(format!("anchor {name:?} has no ANCHOR_END")),
        Some(name) => Err(format!("no anchor {name:?}")),
    }
}

/// A stale or broken block: where, and what is wrong.
#[derive(Debug, PartialEq, Eq)]
struct Finding {
    line: usize,
    what: String,
}

/// Checks `markdown`'s blocks against the files `read` gives; returns the
/// findings and the text with every stale block rewritten.
fn sync(
    markdown: &str,
    read: impl Fn(&str) -> Result<String, String>,
) -> Result<(Vec<Finding>, String), String> {
    let mut findings = Vec::new();
    let mut fixed = markdown.to_owned();
    // From the last block back, so earlier ranges stay valid.
    for b in blocks(markdown)?.into_iter().rev() {
        let shown = match &b.anchor {
            Some(a) => format!("{}#{a}", b.path),
            None => b.path.clone(),
        };
        let want = read(&b.path).and_then(|text| region(&text, b.anchor.as_deref()));
        match want {
            Ok(want) if want == markdown[b.content.clone()] => {}
            Ok(want) => {
                fixed.replace_range(b.content.clone(), &want);
                findings.push(Finding {
                    line: b.line,
                    what: format!("stale, differs from {shown}"),
                });
            }
            Err(e) => findings.push(Finding {
                line: b.line,
                what: format!("{shown}: {e}"),
            }),
        }
    }
    findings.reverse();
    Ok((findings, fixed))
}

/// A marker's path, read under `root`: relative, never climbing out.
fn read_under(root: &Path, path: &str) -> Result<String, String> {
    let p = Path::new(path);
    if !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err("the path must be relative to the workspace root, without `..`".into());
    }
    std::fs::read_to_string(root.join(p)).map_err(|e| e.to_string())
}

/// `cargo xtask docs-sync [--fix]` over README.md and docs/*.md.
pub(crate) fn run(args: &[String], root: &Path) -> Result<(), String> {
    let fix = match args {
        [] => false,
        [a] if a == "--fix" => true,
        _ => return Err("usage: cargo xtask docs-sync [--fix]".into()),
    };
    let mut files = vec![root.join("README.md")];
    if let Ok(dir) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<_> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
    }
    let mut problems = Vec::new();
    let mut blocks_seen = 0;
    for file in files {
        let name = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{name}: {e}"))?;
        blocks_seen += blocks(&text).map(|b| b.len()).unwrap_or(0);
        let (findings, fixed) =
            sync(&text, |p| read_under(root, p)).map_err(|e| format!("{name}: {e}"))?;
        let stale = findings
            .iter()
            .filter(|f| f.what.starts_with("stale"))
            .count();
        if fix && stale > 0 {
            std::fs::write(&file, fixed).map_err(|e| format!("{name}: {e}"))?;
            println!("{name}: rewrote {stale} block(s)");
        }
        for f in findings {
            if !(fix && f.what.starts_with("stale")) {
                problems.push(format!("{name}:{}: {}", f.line, f.what));
            }
        }
    }
    if problems.is_empty() {
        println!("docs-sync: {blocks_seen} example block(s) match their files");
        return Ok(());
    }
    for p in &problems {
        eprintln!("{p}");
    }
    Err(format!(
        "{} example block(s) stale or broken{}",
        problems.len(),
        if fix {
            ""
        } else {
            "; `cargo xtask docs-sync --fix` rewrites stale ones"
        }
    ))
}

#[cfg(test)]
mod tests;

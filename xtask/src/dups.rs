//! `cargo xtask backend-dups [--max N]`: how many lines the two SQL backends
//! (`crates/idem-sqlite/src` and `crates/idem-postgres/src`) still repeat.
//!
//! What counts, precisely:
//! - Every `.rs` file under each backend's `src/` is read line by line.
//! - Each line is normalised: leading and trailing whitespace dropped, inner
//!   runs of whitespace collapsed to one space; SQL placeholders `$N` and `?N`
//!   become `?`; driver names become neutral ones (`PostgreSQL`/`SQLite` →
//!   `DB`, `Postgres`/`Sqlite` → `Db`, `postgres`/`sqlite` → `db`, and a `Pg`
//!   that starts an identifier followed by a capital letter, as in `PgRow`,
//!   `PgPool`, `PgStore`, → `Db`).
//! - A normalised line is trivial, and never counted, when it is empty, is a
//!   comment (starts with `//`, so doc comments too), or holds only braces,
//!   brackets, parentheses and punctuation (`{`, `});`, `],`, …).
//! - For two files with the same relative path (a mirrored pair), the
//!   identical lines are the multiset intersection of their non-trivial
//!   normalised lines: a line found 3 times in one and twice in the other
//!   counts 2.
//! - "Across other files" is the multiset intersection of the two whole trees
//!   minus the sum over mirrored pairs: lines one backend holds in a file the
//!   other backend holds in a differently named file.
//! - The total is the mirrored sum plus the across-files count; `--max N`
//!   exits 1 when the total is above N.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub const USAGE: &str = "\
usage: cargo xtask backend-dups [--max N]

Counts the non-trivial lines identical between crates/idem-sqlite/src and
crates/idem-postgres/src, per mirrored file pair (same relative path) and
across the other files, after normalising whitespace, placeholders ($N and ?N
become ?) and driver names (Postgres/Sqlite, PgRow/SqliteRow, PgPool/SqlitePool,
PgStore/SqliteStore, Pg…/Sqlite…, postgres/sqlite). Blank lines, comments and
lines of only braces, brackets and punctuation do not count. A line repeated
in both files counts as often as the smaller side holds it. With --max N,
exits 1 when the total is above N.";

type Lines = HashMap<String, usize>;

pub fn run(args: &[String], root: &Path) -> Result<(), String> {
    let mut max = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--max" => {
                let v = it.next().ok_or("--max needs a number")?;
                max = Some(
                    v.parse::<usize>()
                        .map_err(|e| format!("--max {v:?}: {e}"))?,
                );
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    let sqlite = read_tree(&root.join("crates/idem-sqlite/src"))?;
    let postgres = read_tree(&root.join("crates/idem-postgres/src"))?;
    let mut mirrored = 0;
    println!("{:<28} {:>6}", "mirrored pair", "lines");
    for (rel, a) in &sqlite {
        if let Some(b) = postgres.get(rel) {
            let n = common(a, b);
            mirrored += n;
            println!("{:<28} {n:>6}", rel.display());
        }
    }
    let whole = common(&merge(sqlite.values()), &merge(postgres.values()));
    let across = whole.saturating_sub(mirrored);
    let total = mirrored + across;
    println!("{:<28} {mirrored:>6}", "mirrored pairs, sum");
    println!("{:<28} {across:>6}", "across other files");
    println!("{:<28} {total:>6}", "total");
    match max {
        Some(m) if total > m => Err(format!("{total} identical lines, more than --max {m}")),
        _ => Ok(()),
    }
}

fn read_tree(dir: &Path) -> Result<BTreeMap<PathBuf, Lines>, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", d.display()))?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let rel = path.strip_prefix(dir).map_err(|e| e.to_string())?;
                out.insert(rel.to_path_buf(), counted(&text));
            }
        }
    }
    Ok(out)
}

fn counted(text: &str) -> Lines {
    let mut lines = Lines::new();
    for line in text.lines() {
        let n = normalise(line);
        if !trivial(&n) {
            *lines.entry(n).or_default() += 1;
        }
    }
    lines
}

fn merge<'a>(files: impl Iterator<Item = &'a Lines>) -> Lines {
    let mut all = Lines::new();
    for f in files {
        for (l, n) in f {
            *all.entry(l.clone()).or_default() += n;
        }
    }
    all
}

fn common(a: &Lines, b: &Lines) -> usize {
    a.iter()
        .map(|(l, n)| (*n).min(b.get(l).copied().unwrap_or(0)))
        .sum()
}

fn trivial(line: &str) -> bool {
    line.is_empty()
        || line.starts_with("//")
        || line.chars().all(|c| c.is_ascii_punctuation() || c == ' ')
}

/// One line, normalised as the module doc says.
pub fn normalise(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut s = words.join(" ");
    for (from, to) in [
        ("PostgreSQL", "DB"),
        ("SQLite", "DB"),
        ("Postgres", "Db"),
        ("Sqlite", "Db"),
        ("postgres", "db"),
        ("sqlite", "db"),
    ] {
        s = s.replace(from, to);
    }
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let prev_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if (c == '$' || c == '?') && chars.get(i + 1).is_some_and(char::is_ascii_digit) {
            out.push('?');
            i += 1;
            while chars.get(i).is_some_and(char::is_ascii_digit) {
                i += 1;
            }
            continue;
        }
        if c == 'P'
            && !prev_ident
            && chars.get(i + 1) == Some(&'g')
            && chars.get(i + 2).is_some_and(char::is_ascii_uppercase)
        {
            out.push_str("Db");
            i += 2;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_names_and_spaces_are_normalised() {
        assert_eq!(
            normalise("  let r: PgRow =  q($1, ?12);"),
            normalise("let r: SqliteRow = q(?, ?);")
        );
        assert_eq!(normalise("PgPool"), "DbPool");
        assert_eq!(normalise("UpgRade"), "UpgRade");
    }

    #[test]
    fn braces_comments_and_blanks_are_trivial() {
        for l in ["", "});", "],", "// x", "/// doc"] {
            assert!(trivial(&normalise(l)), "{l:?}");
        }
        assert!(!trivial("Ok(())"));
    }

    #[test]
    fn a_repeated_line_counts_as_often_as_the_smaller_side_holds_it() {
        let a = counted("x();\nx();\nx();\ny();\n");
        let b = counted("x();\nx();\nz();\n");
        assert_eq!(common(&a, &b), 2);
    }
}

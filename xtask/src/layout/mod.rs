//! `cargo xtask layout`: the shape the code base keeps, checked. Each rule
//! and exactly what it counts is in [`USAGE`] (printed by `--help`); the
//! import-circle rule in detail in [`modules`].

mod lex;
mod macros;
mod modules;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

pub(crate) const USAGE: &str = "\
usage: cargo xtask layout

Fails, listing every violation, when:
  macros    a macro_rules! in a library crate's src/ (a crates/* with
            src/lib.rs) or in crates/idem-server/src, test files aside,
            implements a trait (an `impl … for` in its body) or writes a
            function or method (a `fn NAME` / `fn $name` in its body), unless
            MACRO_ALLOWED in xtask/src/layout/mod.rs names it with its reason
            (an entry whose file no longer defines it fails too); or the
            lines of idem-sql's macro_rules! definitions (from the
            `macro_rules!` line to its closing delimiter) are 5 % or more of
            the lines of its src/*.rs files
  backends  a SQL backend's src/ (crates/idem-sqlite, crates/idem-postgres;
            a new SQL backend is added to SQL_BACKENDS in
            xtask/src/layout/mod.rs) holds more than 2400 lines
  server    crates/idem-server/src holds more than 6000 lines, or one of its
            files more than 400
  libraries a file of a library crate's src/ (a crates/* with src/lib.rs,
            idem-server aside) holds more than 700 lines
  circles   two modules import each other, anywhere in the workspace
            (crates/*, examples/*, xtask: src/, tests/, benches/), or three
            or more children of one module import each other in a circle

Lines are the lines of a file, blank and comment lines included. Test files
(a file named tests.rs or under a directory named tests) do not count for the
size rules. A module is a file (src/a.rs or src/a/mod.rs is `a`,
src/a/b.rs `a::b`) or an inline `mod x { … }`; its imports are the paths in
its own code (comments and strings aside): `use` trees and any `x::y` path
starting with crate, self, super or a child module's name, naming the deepest
module the path walks through. A re-export (`pub use`, `pub(crate) use`)
publishes another module's item and is not an import. A submodule is a
module of its own, but a module and its own descendant importing each
other are no circle (one subtree: the child sees the parent's private items,
the parent is its children's face); siblings and cousins are.";

/// The crates that implement the SQL store for one database.
pub(crate) const SQL_BACKENDS: &[&str] = &["idem-sqlite", "idem-postgres"];
/// The crate whose share of macro lines is bounded.
const SQL_SHARED: &str = "idem-sql";
const SERVER: &str = "idem-server";

/// A SQL backend holds what only its database has (its `Dialect`: the
/// driver's binding and the hot path's messages; SQLite's single writer and
/// gates; PostgreSQL's inline messages, prepared statements, kept
/// connections, LISTEN and server clock); every store trait is written once
/// in idem-sql. 2,400 is about today's PostgreSQL backend (2,266) with room
/// for a fix, not for a capability: a new store capability goes into
/// idem-sql.
pub(crate) const BACKEND_MAX_LINES: usize = 2400;
pub(crate) const SERVER_MAX_LINES: usize = 6000;
pub(crate) const SERVER_FILE_MAX_LINES: usize = 400;
pub(crate) const LIBRARY_FILE_MAX_LINES: usize = 700;
/// Macro lines must stay under this share of idem-sql's lines, in percent.
pub(crate) const MACRO_MAX_PERCENT: usize = 5;

/// The macros that may implement a trait or write a function: (file, macro,
/// why). Each declares one small type's boilerplate (a validated name's
/// newtype, a stored enum's text), not store or handler code; store and
/// handler code is written once with generics instead.
pub(crate) const MACRO_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "crates/idem-core/src/tasks/names.rs",
        "name_type",
        "declares a type's boilerplate (a validated name's newtype: new, as_str, Display), not store code",
    ),
    (
        "crates/idem-core/src/steps/state.rs",
        "named_enum",
        "declares a type's boilerplate (a stored enum's ALL, as_str, parse, Display), not store code",
    ),
];

pub(crate) fn run(args: &[String], root: &Path) -> Result<(), String> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    if let Some(a) = args.first() {
        return Err(format!("unexpected argument {a:?}\n\n{USAGE}"));
    }
    let report = check(root)?;
    for note in &report.notes {
        println!("layout: {note}");
    }
    if report.violations.is_empty() {
        println!("layout: ok");
        return Ok(());
    }
    for v in &report.violations {
        println!("  {v}");
    }
    Err(format!(
        "{} layout violation(s), listed above",
        report.violations.len()
    ))
}

/// What the gate found: violations fail it, notes are what it measured.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) violations: Vec<String>,
    pub(crate) notes: Vec<String>,
}

pub(crate) fn check(root: &Path) -> Result<Report, String> {
    let mut report = Report::default();
    let crates = root.join("crates");
    for name in SQL_BACKENDS.iter().chain([&SQL_SHARED, &SERVER]) {
        if !crates.join(name).join("src").is_dir() {
            return Err(format!(
                "no crates/{name}/src: the layout rules name it (xtask/src/layout/mod.rs)"
            ));
        }
    }
    macro_rule(root, &mut report)?;
    for name in SQL_BACKENDS {
        let lines = counted_lines(&crates.join(name).join("src"))?;
        report.notes.push(format!(
            "crates/{name}/src: {lines} lines (the bound: at most {BACKEND_MAX_LINES})"
        ));
        if lines > BACKEND_MAX_LINES {
            report.violations.push(format!(
                "backends: crates/{name}/src holds {lines} lines, more than {BACKEND_MAX_LINES}"
            ));
        }
    }
    let server = crates.join(SERVER).join("src");
    let mut total = 0;
    for (file, lines) in files_with_lines(&server)? {
        if is_test_file(&server, &file) {
            continue;
        }
        total += lines;
        if lines > SERVER_FILE_MAX_LINES {
            report.violations.push(format!(
                "server: {} holds {lines} lines, more than {SERVER_FILE_MAX_LINES}",
                shown(root, &file)
            ));
        }
    }
    report.notes.push(format!(
        "crates/{SERVER}/src: {total} lines, tests aside (the bound: at most {SERVER_MAX_LINES})"
    ));
    if total > SERVER_MAX_LINES {
        report.violations.push(format!(
            "server: crates/{SERVER}/src holds {total} lines (tests aside), more than {SERVER_MAX_LINES}"
        ));
    }
    for dir in subdirs(&crates)? {
        let src = dir.join("src");
        if dir.ends_with(SERVER) || !src.join("lib.rs").is_file() {
            continue;
        }
        for (file, lines) in files_with_lines(&src)? {
            if lines > LIBRARY_FILE_MAX_LINES && !is_test_file(&src, &file) {
                report.violations.push(format!(
                    "libraries: {} holds {lines} lines, more than {LIBRARY_FILE_MAX_LINES}",
                    shown(root, &file)
                ));
            }
        }
    }
    circle_rule(root, &mut report)?;
    Ok(report)
}

fn macro_rule(root: &Path, report: &mut Report) -> Result<(), String> {
    let crates = root.join("crates");
    let mut seen_allowed = Vec::new();
    for dir in subdirs(&crates)? {
        let src = dir.join("src");
        if !dir.ends_with(SERVER) && !src.join("lib.rs").is_file() {
            continue;
        }
        for (file, _) in files_with_lines(&src)? {
            if is_test_file(&src, &file) {
                continue;
            }
            let text = read(&file)?;
            let at_file = shown(root, &file);
            for def in macros::macro_defs(&text) {
                let writes = def.impl_for.is_some() || def.writes_fn.is_some();
                let allowed = MACRO_ALLOWED
                    .iter()
                    .find(|(f, n, _)| root.join(f) == file && *n == def.name);
                if let (true, Some((_, name, why))) = (writes, allowed) {
                    seen_allowed.push(*name);
                    report.notes.push(format!(
                        "macro_rules! {name} at {at_file}:{} allowed: {why}",
                        def.first_line
                    ));
                    continue;
                }
                if let Some(line) = def.impl_for {
                    report.violations.push(format!(
                        "macros: macro_rules! {} implements a trait (impl … for at {at_file}:{line})",
                        def.name
                    ));
                }
                if let Some(line) = def.writes_fn {
                    report.violations.push(format!(
                        "macros: macro_rules! {} writes a function (fn at {at_file}:{line})",
                        def.name
                    ));
                }
            }
        }
    }
    for (file, name, _) in MACRO_ALLOWED {
        let in_workspace = Path::new(file)
            .components()
            .nth(1)
            .is_some_and(|c| crates.join(c).is_dir());
        if in_workspace && !seen_allowed.contains(name) {
            report.violations.push(format!(
                "macros: MACRO_ALLOWED names macro_rules! {name} in {file}, which no longer defines it there (or it no longer implements a trait or writes a function): remove the entry"
            ));
        }
    }
    let src = crates.join(SQL_SHARED).join("src");
    let (mut total, mut in_macros) = (0, 0);
    for (file, lines) in files_with_lines(&src)? {
        total += lines;
        in_macros += macros::macro_defs(&read(&file)?)
            .iter()
            .map(macros::MacroDef::lines)
            .sum::<usize>();
    }
    // Compared in whole numbers: in_macros / total < MAX / 100.
    let share = in_macros as f64 * 100.0 / total.max(1) as f64;
    report.notes.push(format!(
        "crates/{SQL_SHARED}/src: {in_macros} of {total} lines in macro_rules! ({share:.1} %; the bound: under {MACRO_MAX_PERCENT} %)"
    ));
    if in_macros * 100 >= MACRO_MAX_PERCENT * total {
        report.violations.push(format!(
            "macros: {in_macros} of crates/{SQL_SHARED}/src's {total} lines ({share:.1} %) are in macro_rules!, {MACRO_MAX_PERCENT} % or more"
        ));
    }
    Ok(())
}

fn circle_rule(root: &Path, report: &mut Report) -> Result<(), String> {
    let mut packages = subdirs(&root.join("crates"))?;
    packages.extend(subdirs(&root.join("examples"))?);
    packages.push(root.join("xtask"));
    let mut trees = 0;
    for package in packages {
        for roots in crate_roots(&package)? {
            trees += 1;
            let tree = modules::tree(&roots);
            for circle in modules::circles(&tree) {
                let names: std::collections::BTreeSet<String> = circle
                    .links
                    .iter()
                    .flat_map(|(a, b, _)| [modules::display(a), modules::display(b)])
                    .collect();
                let names: Vec<String> = names.into_iter().collect();
                let kin = match &circle.links[..] {
                    [_, _] => "",
                    _ => " (a circle among siblings)",
                };
                let mut said = format!(
                    "circles: in {}: {} import each other{kin}:",
                    shown(root, roots[0].parent().unwrap_or(root)),
                    names.join(", ")
                );
                for (a, b, at) in &circle.links {
                    said.push_str(&format!(
                        "\n      {} → {} ({}:{})",
                        modules::display(a),
                        modules::display(b),
                        shown(root, &at.file),
                        at.line
                    ));
                }
                report.violations.push(said);
            }
        }
    }
    report
        .notes
        .push(format!("{trees} module trees read for import circles"));
    Ok(())
}

/// The crate roots of one package, each list one module tree: `src/lib.rs`
/// with `src/main.rs`; each `src/bin/*`, `tests/*`, `benches/*`, `examples/*`.
fn crate_roots(package: &Path) -> Result<Vec<Vec<PathBuf>>, String> {
    let mut out = Vec::new();
    let main: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| package.join("src").join(f))
        .filter(|p| p.is_file())
        .collect();
    if !main.is_empty() {
        out.push(main);
    }
    for dir in [
        package.join("src/bin"),
        package.join("tests"),
        package.join("benches"),
        package.join("examples"),
    ] {
        if !dir.is_dir() {
            continue;
        }
        for entry in sorted_entries(&dir)? {
            if entry.extension().is_some_and(|e| e == "rs") && entry.is_file() {
                out.push(vec![entry]);
            } else if entry.join("main.rs").is_file() {
                out.push(vec![entry.join("main.rs")]);
            }
        }
    }
    Ok(out)
}

fn is_test_file(src: &Path, file: &Path) -> bool {
    let rel = file.strip_prefix(src).unwrap_or(file);
    rel.file_name().is_some_and(|n| n == "tests.rs")
        || rel
            .parent()
            .is_some_and(|p| p.components().any(|c| c.as_os_str() == "tests"))
}

fn counted_lines(src: &Path) -> Result<usize, String> {
    Ok(files_with_lines(src)?
        .into_iter()
        .filter(|(f, _)| !is_test_file(src, f))
        .map(|(_, n)| n)
        .sum())
}

/// Every `.rs` file under `dir`, with its number of lines, in path order.
pub(crate) fn files_with_lines(dir: &Path) -> Result<Vec<(PathBuf, usize)>, String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for p in sorted_entries(&d)? {
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let lines = read(&p)?.lines().count();
                out.push((p, lines));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    v.sort();
    Ok(v)
}

fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, String> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    Ok(sorted_entries(dir)?
        .into_iter()
        .filter(|p| p.is_dir())
        .collect())
}

fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))
}

fn shown(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

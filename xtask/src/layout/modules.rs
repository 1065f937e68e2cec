//! Import circles: modules that import each other, drawn from the code's own
//! paths. What counts, precisely (also in `cargo xtask layout --help`):
//!
//! - A module tree starts at a crate root (`src/lib.rs` and `src/main.rs`,
//!   taken together as the module `crate`; each `src/bin/*.rs`,
//!   `src/bin/*/main.rs`, `tests/*.rs`, `tests/*/main.rs`, `benches/…` and
//!   `examples/…` the same way) and follows its `mod NAME;` declarations to
//!   `NAME.rs` or `NAME/mod.rs` (a `#[path]` attribute is not followed; a
//!   declared file that is not found is skipped). A file is one module; an
//!   inline `mod NAME { … }` is a module of its own (so `mod tests { use
//!   super::*; }` is the module `…::tests`); submodules are modules of their
//!   own, never merged into their parent.
//! - A module's imports are the paths in its own code, comments and string
//!   literals aside: every `use` tree (groups, `self`, globs and `as` read),
//!   and every path `a::b…` elsewhere (expressions, types, patterns,
//!   attributes, macro bodies and invocations, `$crate::…`), that starts with
//!   `crate`, `self`, `super` (repeated) or the name of one of the module's
//!   child modules. The path names the deepest module it walks through
//!   (`crate::a::b::Item` imports `a::b` when `a::b` is a module, else `a`).
//!   A path naming the module itself, or starting elsewhere (another crate,
//!   a type, `Self`), is no import; nor is a re-export (a `use` with a
//!   visibility: `pub use child::X` publishes X, the module's face, and is
//!   not code of the module that uses the child).
//! - Reported: every pair of modules that import each other, a module and
//!   its own descendant aside (a child sees its parent's private items and
//!   the parent is its children's face: they are one subtree, as a drawing
//!   of the house shows them, not two rooms leaning on each other), and
//!   every longer circle among the children
//!   of one module (each a strongly connected set of three or more siblings),
//!   each with the file and line of each import in it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::lex::{Tok, Token, tokens};

/// A module path below the crate root (`[]` is the root).
type ModPath = Vec<String>;

/// Where an import is written.
#[derive(Debug, Clone)]
pub(crate) struct At {
    pub(crate) file: PathBuf,
    pub(crate) line: usize,
}

/// One module tree: its modules and the imports between them (first place
/// each is written).
#[derive(Debug, Default)]
pub(crate) struct Tree {
    pub(crate) modules: BTreeSet<ModPath>,
    pub(crate) edges: BTreeMap<(ModPath, ModPath), At>,
}

/// A path as written, in the module it is written in.
struct Ref {
    module: ModPath,
    segs: Vec<String>,
    line: usize,
}

/// What one file holds for the graph.
#[derive(Default)]
struct Scan {
    /// Inline `mod NAME {` modules, as full paths.
    inline: Vec<ModPath>,
    /// `mod NAME;` declarations: the inline path within the file, and NAME.
    decls: Vec<(ModPath, String)>,
    refs: Vec<Ref>,
}

fn scan(toks: &[Token], module: &ModPath) -> Scan {
    let mut out = Scan::default();
    // Inline modules open: (path, brace depth inside them).
    let mut open: Vec<(ModPath, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let current = open.last().map_or(module, |(m, _)| m).clone();
        let t = &toks[i];
        let next = toks.get(i + 1);
        if t.is_punct('{') {
            depth += 1;
        } else if t.is_punct('}') {
            depth = depth.saturating_sub(1);
            if open.last().is_some_and(|(_, d)| *d > depth) {
                open.pop();
            }
        } else if let (true, Some(name)) = (t.is_ident("mod"), next.and_then(Token::ident)) {
            let name = name.to_owned();
            match toks.get(i + 2) {
                Some(b) if b.is_punct('{') => {
                    let mut path = current.clone();
                    path.push(name);
                    out.inline.push(path.clone());
                    open.push((path, depth + 1));
                }
                Some(s) if s.is_punct(';') => {
                    out.decls.push((current[module.len()..].to_vec(), name));
                }
                _ => {}
            }
            i += 2;
            continue;
        } else if t.is_ident("use") && next.is_some_and(|n| !n.is_punct('<')) {
            let mut paths = Vec::new();
            let end = use_tree(toks, i + 1, Vec::new(), &mut paths);
            // A re-export publishes another module's item as this one's: it
            // is the module's face, not code of its own that uses the other.
            let paths = if reexport(toks, i) { Vec::new() } else { paths };
            for segs in paths {
                out.refs.push(Ref {
                    module: current.clone(),
                    segs,
                    line: t.line,
                });
            }
            i = end.max(i + 1);
            continue;
        } else if t.ident().is_some()
            && next.is_some_and(|n| n.tok == Tok::PathSep)
            && (i == 0 || toks[i - 1].tok != Tok::PathSep)
        {
            let mut segs = Vec::new();
            let mut j = i;
            while let Some(id) = toks.get(j).and_then(Token::ident) {
                segs.push(id.to_owned());
                if toks.get(j + 1).is_some_and(|n| n.tok == Tok::PathSep) {
                    j += 2;
                } else {
                    j += 1;
                    break;
                }
            }
            out.refs.push(Ref {
                module: current,
                segs,
                line: t.line,
            });
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// Whether the `use` at `i` has a visibility (`pub use`, `pub(crate) use`,
/// `pub(in …) use`).
fn reexport(toks: &[Token], i: usize) -> bool {
    match i.checked_sub(1).map(|k| &toks[k]) {
        Some(t) if t.is_ident("pub") => true,
        Some(t) if t.is_punct(')') => {
            let open = toks[..i - 1].iter().rposition(|t| t.is_punct('('));
            open.and_then(|k| k.checked_sub(1))
                .is_some_and(|k| toks[k].is_ident("pub"))
        }
        _ => false,
    }
}

/// Reads one use tree from `i`, pushing each path it names (a group's
/// prefix joined to each member; a glob names the module before it).
/// Returns the index after the tree.
fn use_tree(
    toks: &[Token],
    mut i: usize,
    mut segs: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    if segs.is_empty() && toks.get(i).is_some_and(|t| t.tok == Tok::PathSep) {
        // `use ::name` is always another crate.
        segs.push("::".into());
        i += 1;
    }
    while let Some(t) = toks.get(i) {
        if t.is_punct('{') {
            i += 1;
            while let Some(t) = toks.get(i) {
                if t.is_punct('}') {
                    i += 1;
                    break;
                }
                if t.is_punct(',') {
                    i += 1;
                    continue;
                }
                let before = i;
                i = use_tree(toks, i, segs.clone(), out);
                if i == before {
                    i += 1;
                }
            }
            return i;
        }
        if t.is_punct('*') {
            i += 1;
            break;
        }
        match t.ident() {
            Some("as") => break,
            Some(id) => {
                segs.push(id.to_owned());
                i += 1;
                if toks.get(i).is_some_and(|n| n.tok == Tok::PathSep) {
                    i += 1;
                    continue;
                }
                break;
            }
            None => break,
        }
    }
    if toks.get(i).is_some_and(|t| t.is_ident("as")) {
        i += 2;
    }
    if !segs.is_empty() {
        out.push(segs);
    }
    i
}

/// The module a path names, if it is one of this tree's.
fn resolve(current: &ModPath, segs: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let first = segs.first()?;
    let (mut target, rest): (ModPath, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &segs[1..]),
        "self" => (current.clone(), &segs[1..]),
        "super" => {
            let mut base = current.clone();
            let mut k = 0;
            while segs.get(k).is_some_and(|s| s == "super") {
                base.pop()?;
                k += 1;
            }
            (base, &segs[k..])
        }
        name => {
            let mut child = current.clone();
            child.push(name.to_owned());
            if !modules.contains(&child) {
                return None;
            }
            (current.clone(), segs)
        }
    };
    for s in rest.iter().filter(|s| *s != "self") {
        target.push(s.clone());
        if !modules.contains(&target) {
            target.pop();
            break;
        }
    }
    Some(target)
}

/// The module tree rooted at `roots` (files that are all the module `crate`).
pub(crate) fn tree(roots: &[PathBuf]) -> Tree {
    // (file, its module, the directory its `mod x;` files live in)
    let mut todo: Vec<(PathBuf, ModPath, PathBuf)> = roots
        .iter()
        .map(|r| {
            (
                r.clone(),
                Vec::new(),
                r.parent().map(Path::to_path_buf).unwrap_or_default(),
            )
        })
        .collect();
    let mut files: Vec<(PathBuf, Scan)> = Vec::new();
    let mut tree = Tree::default();
    while let Some((file, module, dir)) = todo.pop() {
        let Ok(src) = std::fs::read_to_string(&file) else {
            continue;
        };
        let s = scan(&tokens(&src), &module);
        tree.modules.insert(module.clone());
        tree.modules.extend(s.inline.iter().cloned());
        for (inline, name) in &s.decls {
            let sub = inline.iter().fold(dir.clone(), |d, m| d.join(m));
            let (flat, nested) = (
                sub.join(format!("{name}.rs")),
                sub.join(name).join("mod.rs"),
            );
            let mut path = module.clone();
            path.extend(inline.iter().cloned());
            path.push(name.clone());
            if flat.is_file() {
                todo.push((flat, path, sub.join(name)));
            } else if nested.is_file() {
                todo.push((nested, path, sub.join(name)));
            }
        }
        files.push((file, s));
    }
    for (file, s) in &files {
        for r in &s.refs {
            let Some(target) = resolve(&r.module, &r.segs, &tree.modules) else {
                continue;
            };
            if target != r.module {
                tree.edges
                    .entry((r.module.clone(), target))
                    .or_insert_with(|| At {
                        file: file.clone(),
                        line: r.line,
                    });
            }
        }
    }
    tree
}

/// A circle found: its modules in order, each importing the next (the last
/// the first), with where each import is written.
#[derive(Debug)]
pub(crate) struct Circle {
    pub(crate) links: Vec<(ModPath, ModPath, At)>,
}

pub(crate) fn circles(tree: &Tree) -> Vec<Circle> {
    let mut found = Vec::new();
    for ((a, b), at) in &tree.edges {
        if a < b
            && !a.starts_with(b)
            && !b.starts_with(a)
            && let Some(back) = tree.edges.get(&(b.clone(), a.clone()))
        {
            found.push(Circle {
                links: vec![
                    (a.clone(), b.clone(), at.clone()),
                    (b.clone(), a.clone(), back.clone()),
                ],
            });
        }
    }
    // Longer circles among siblings: strongly connected sets of three or more.
    let mut by_parent: BTreeMap<ModPath, Vec<ModPath>> = BTreeMap::new();
    for m in tree.modules.iter().filter(|m| !m.is_empty()) {
        by_parent
            .entry(m[..m.len() - 1].to_vec())
            .or_default()
            .push(m.clone());
    }
    for siblings in by_parent.values() {
        for set in strongly_connected(siblings, &tree.edges) {
            if set.len() < 3 {
                continue;
            }
            let links = tree
                .edges
                .iter()
                .filter(|((a, b), _)| set.contains(a) && set.contains(b))
                .map(|((a, b), at)| (a.clone(), b.clone(), at.clone()))
                .collect();
            found.push(Circle { links });
        }
    }
    found
}

/// Tarjan's strongly connected components of the graph `edges` restricted
/// to `nodes`.
fn strongly_connected(
    nodes: &[ModPath],
    edges: &BTreeMap<(ModPath, ModPath), At>,
) -> Vec<BTreeSet<ModPath>> {
    struct State<'a> {
        nodes: &'a [ModPath],
        next: Vec<Vec<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        out: Vec<BTreeSet<ModPath>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on[v] = true;
        for w in s.next[v].clone() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut set = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                set.insert(s.nodes[w].clone());
                if w == v {
                    break;
                }
            }
            s.out.push(set);
        }
    }
    let position: BTreeMap<&ModPath, usize> =
        nodes.iter().enumerate().map(|(k, m)| (m, k)).collect();
    let mut next = vec![Vec::new(); nodes.len()];
    for (a, b) in edges.keys() {
        if let (Some(&x), Some(&y)) = (position.get(a), position.get(b)) {
            next[x].push(y);
        }
    }
    let n = nodes.len();
    let mut s = State {
        nodes,
        next,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

pub(crate) fn display(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

//! The layout gate on small fake workspaces: each rule fires on a tree made
//! to break it and stays quiet on a clean one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Report, check};

/// A fake workspace in a fresh temporary directory, removed on drop: the
/// crates the rules name, each with a small `src/lib.rs` (the server a
/// `src/main.rs`).
struct Fake {
    root: PathBuf,
}

impl Fake {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "xtask-layout-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&root);
        let fake = Self { root };
        for name in ["idem-sql", "idem-sqlite", "idem-postgres"] {
            fake.write(
                &format!("crates/{name}/src/lib.rs"),
                &lines("//! a library", 100),
            );
        }
        fake.write(
            "crates/idem-server/src/main.rs",
            "mod a;\nmod b;\nfn main() { a::run(); }\n",
        );
        fake.write(
            "crates/idem-server/src/a.rs",
            "use crate::b::helper;\npub fn run() { helper() }\n",
        );
        fake.write("crates/idem-server/src/b.rs", "pub fn helper() {}\n");
        fake
    }

    fn write(&self, rel: &str, text: &str) {
        let path = self.root.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("create a fixture directory");
        }
        std::fs::write(path, text).expect("write a fixture file");
    }

    fn check(&self) -> Report {
        check(&self.root).expect("the fake workspace is readable")
    }

    fn violations(&self, rule: &str) -> Vec<String> {
        self.check()
            .violations
            .into_iter()
            .filter(|v| v.starts_with(&format!("{rule}:")))
            .collect()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// `first` then `n - 1` more lines of code.
fn lines(first: &str, n: usize) -> String {
    let mut s = format!("{first}\n");
    for k in 1..n {
        s.push_str(&format!("pub const C{k}: u8 = 0;\n"));
    }
    s
}

fn root(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn a_clean_tree_passes() {
    let fake = Fake::new();
    let report = fake.check();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("0 of 100 lines in macro_rules!")),
        "{:?}",
        report.notes
    );
}

#[test]
fn a_missing_crate_the_rules_name_is_an_error_not_a_pass() {
    let fake = Fake::new();
    std::fs::remove_dir_all(fake.root.join("crates/idem-postgres")).expect("remove");
    let err = check(&fake.root).expect_err("idem-postgres is gone");
    assert!(
        err.contains("crates/idem-postgres/src"),
        "{err} in {}",
        root(&fake.root)
    );
}

#[test]
fn a_macro_implementing_a_trait_or_writing_a_method_fires() {
    let fake = Fake::new();
    let store = "\
macro_rules! key_store {
    ($t:ty) => {
        impl KeyStore for $t {
            async fn get(&self) {}
        }
    };
}
";
    fake.write("crates/idem-sql/src/keys.rs", store);
    fake.write("crates/idem-sql/src/lib.rs", &lines("mod keys;", 400));
    let v = fake.violations("macros");
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(
        v[0].contains("key_store implements a trait")
            && v[0].contains("crates/idem-sql/src/keys.rs:3")
    );
    assert!(v[1].contains("key_store writes a function") && v[1].contains("keys.rs:4"));
    // In a backend too: the rule is about the store, wherever it is written.
    let fake = Fake::new();
    fake.write(
        "crates/idem-sqlite/src/lib.rs",
        "macro_rules! m { () => { fn f() {} } }\n",
    );
    let v = fake.violations("macros");
    assert!(
        v.len() == 1 && v[0].contains("crates/idem-sqlite/src/lib.rs:1"),
        "{v:?}"
    );
}

#[test]
fn a_macro_in_any_library_crate_or_the_server_implementing_a_trait_fires() {
    let fake = Fake::new();
    let demo = "\
macro_rules! demo_sql {
    ($t:ty) => {
        impl DemoSql for $t {}
    };
}
";
    fake.write("crates/idem-demo/src/lib.rs", demo);
    fake.write(
        "crates/idem-server/src/b.rs",
        "pub fn helper() {}\nmacro_rules! h { () => { fn g() {} } }\n",
    );
    let v = fake.violations("macros");
    assert!(
        v.len() == 2
            && v[0].contains("demo_sql implements a trait")
            && v[0].contains("crates/idem-demo/src/lib.rs:3")
            && v[1].contains("h writes a function")
            && v[1].contains("crates/idem-server/src/b.rs:2"),
        "{v:?}"
    );
    // A crate without a lib.rs (not a library) and test files are not read.
    let fake = Fake::new();
    fake.write("crates/idem-tool/src/main.rs", demo);
    fake.write("crates/idem-demo/src/lib.rs", "mod tests;\n");
    fake.write("crates/idem-demo/src/tests.rs", demo);
    fake.write("crates/idem-demo/src/x/tests/m.rs", demo);
    let v = fake.violations("macros");
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn an_allowed_macro_passes_with_its_reason_and_a_stale_entry_fires() {
    let fake = Fake::new();
    fake.write("crates/idem-core/src/lib.rs", "//! core\n");
    for (file, name, _) in super::MACRO_ALLOWED {
        fake.write(
            file,
            &format!("macro_rules! {name} {{ ($n:ident) => {{ impl X for $n {{}} }} }}\n"),
        );
    }
    let (file, name, _) = super::MACRO_ALLOWED[0];
    let report = fake.check();
    let v: Vec<_> = report
        .violations
        .iter()
        .filter(|v| v.starts_with("macros:"))
        .collect();
    assert!(v.is_empty(), "{v:?}");
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains(name) && n.contains("allowed")),
        "{:?}",
        report.notes
    );
    // The same macro under another name, or the allowed file without it, fires.
    fake.write(
        file,
        "macro_rules! other { ($n:ident) => { impl X for $n {} } }\n",
    );
    let v = fake.violations("macros");
    assert!(
        v.len() == 2
            && v.iter().any(|v| v.contains("other implements a trait"))
            && v.iter()
                .any(|v| v.contains(name) && v.contains("no longer")),
        "{v:?}"
    );
}

#[test]
fn a_macro_for_sql_text_only_passes_while_under_five_percent() {
    let fake = Fake::new();
    // 4 lines of macro in 100: 4 %.
    let sql = "macro_rules! table {\n    () => { \"idem_keys\" };\n    (x) => { \"x\" };\n}\n";
    fake.write(
        "crates/idem-sql/src/lib.rs",
        &format!("{sql}{}", lines("//", 96)),
    );
    assert!(fake.violations("macros").is_empty());
    // 5 lines in 100: 5 %, not under.
    let sql = "macro_rules! table {\n    () => { \"idem_keys\" };\n    (x) => { \"x\" };\n    (y) => { \"y\" };\n}\n";
    fake.write(
        "crates/idem-sql/src/lib.rs",
        &format!("{sql}{}", lines("//", 95)),
    );
    let v = fake.violations("macros");
    assert!(
        v.len() == 1 && v[0].contains("5 of crates/idem-sql/src's 100 lines (5.0 %)"),
        "{v:?}"
    );
}

#[test]
fn a_backend_over_2400_lines_fires_and_its_test_files_do_not_count() {
    let fake = Fake::new();
    fake.write("crates/idem-postgres/src/lib.rs", &lines("mod store;", 700));
    fake.write("crates/idem-postgres/src/store.rs", &lines("//", 700));
    fake.write("crates/idem-postgres/src/tests.rs", &lines("//", 600));
    fake.write(
        "crates/idem-postgres/src/store/tests/big.rs",
        &lines("//", 600),
    );
    fake.write("crates/idem-postgres/src/more.rs", &lines("//", 1000));
    assert!(
        fake.violations("backends").is_empty(),
        "exactly 2400 is allowed"
    );
    fake.write("crates/idem-postgres/src/more.rs", &lines("//", 1001));
    let v = fake.violations("backends");
    assert_eq!(
        v,
        ["backends: crates/idem-postgres/src holds 2401 lines, more than 2400"]
    );
}

#[test]
fn the_server_over_6000_lines_or_a_file_over_400_fires() {
    let fake = Fake::new();
    fake.write("crates/idem-server/src/big.rs", &lines("//", 400));
    fake.write("crates/idem-server/src/gateway/tests.rs", &lines("//", 900));
    fake.write(
        "crates/idem-server/src/demo/tests/fixture.rs",
        &lines("//", 900),
    );
    assert!(fake.violations("server").is_empty());
    fake.write("crates/idem-server/src/big.rs", &lines("//", 401));
    let v = fake.violations("server");
    assert_eq!(
        v,
        ["server: crates/idem-server/src/big.rs holds 401 lines, more than 400"]
    );
    fake.write("crates/idem-server/src/big.rs", &lines("//", 400));
    for k in 0..15 {
        fake.write(
            &format!("crates/idem-server/src/m{k}.rs"),
            &lines("//", 400),
        );
    }
    // 16 files of 400 lines and the three small ones (6 lines): 6406 lines.
    let v = fake.violations("server");
    assert_eq!(
        v,
        ["server: crates/idem-server/src holds 6406 lines (tests aside), more than 6000"]
    );
}

#[test]
fn a_library_file_over_700_lines_fires_outside_tests() {
    let fake = Fake::new();
    fake.write("crates/idem-core/src/lib.rs", "mod keys;\n");
    fake.write("crates/idem-core/src/keys.rs", &lines("//", 700));
    fake.write("crates/idem-core/src/keys/tests.rs", &lines("//", 800));
    // Not a library (no lib.rs): a binary's files are not held to 700.
    fake.write("crates/idem-tool/src/main.rs", &lines("//", 900));
    assert!(fake.violations("libraries").is_empty());
    fake.write("crates/idem-core/src/keys.rs", &lines("//", 701));
    let v = fake.violations("libraries");
    assert_eq!(
        v,
        ["libraries: crates/idem-core/src/keys.rs holds 701 lines, more than 700"]
    );
}

#[test]
fn two_sibling_modules_importing_each_other_fire() {
    let fake = Fake::new();
    fake.write(
        "crates/idem-server/src/b.rs",
        "pub fn helper() { super::a::run() }\n",
    );
    let v = fake.violations("circles");
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("circles: in crates/idem-server/src: a, b import each other:"),
        "{}",
        v[0]
    );
    assert!(
        v[0].contains("a → b (crates/idem-server/src/a.rs:1)"),
        "{}",
        v[0]
    );
    assert!(
        v[0].contains("b → a (crates/idem-server/src/b.rs:1)"),
        "{}",
        v[0]
    );
}

#[test]
fn imports_in_use_groups_expressions_and_types_count_and_comments_and_strings_do_not() {
    let fake = Fake::new();
    // Only comments and strings name `a` from `b`: no circle.
    fake.write(
        "crates/idem-server/src/b.rs",
        "// use crate::a;\npub fn helper() { let _ = \"crate::a::run\"; }\n",
    );
    assert!(fake.violations("circles").is_empty());
    // A nested use group names it.
    fake.write(
        "crates/idem-server/src/b.rs",
        "use crate::{x, a::{self as other}};\npub fn helper() {}\n",
    );
    assert_eq!(fake.violations("circles").len(), 1);
    // A type in a signature names it.
    fake.write(
        "crates/idem-server/src/b.rs",
        "pub fn helper(_: crate::a::Thing) {}\n",
    );
    assert_eq!(fake.violations("circles").len(), 1);
}

#[test]
fn a_parent_and_its_child_are_one_subtree_cousins_are_not() {
    let fake = Fake::new();
    fake.write(
        "crates/idem-server/src/b.rs",
        "mod inner;\npub fn helper() { self::inner::go() }\n",
    );
    fake.write("crates/idem-server/src/b/inner.rs", "pub fn go() {}\n");
    assert!(
        fake.violations("circles").is_empty(),
        "a parent using its child"
    );
    // A re-export is the parent's face, not a use: still one way.
    fake.write(
        "crates/idem-server/src/b/inner.rs",
        "pub use super::helper as h;\npub fn go() {}\n",
    );
    assert!(fake.violations("circles").is_empty(), "a re-export");
    fake.write(
        "crates/idem-server/src/b/inner.rs",
        "use super::helper;\npub fn go() {}\n",
    );
    assert!(fake.violations("circles").is_empty(), "parent and child");
    // A cousin using the child, which uses the cousin back, is a circle.
    fake.write(
        "crates/idem-server/src/b/inner.rs",
        "use crate::c::thing;\npub fn go() { thing() }\n",
    );
    fake.write(
        "crates/idem-server/src/c.rs",
        "pub fn thing() {}\npub fn more() { crate::b::inner::go() }\n",
    );
    fake.write(
        "crates/idem-server/src/main.rs",
        "mod b;\nmod c;\nfn main() {}\n",
    );
    let v = fake.violations("circles");
    assert!(
        v.len() == 1 && v[0].contains("b::inner, c import each other"),
        "{v:?}"
    );
}

#[test]
fn an_inline_test_module_using_its_parent_is_no_circle() {
    let fake = Fake::new();
    fake.write(
        "crates/idem-server/src/b.rs",
        "pub fn helper() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { helper() }\n}\n",
    );
    assert!(fake.violations("circles").is_empty());
    // Used back from the file, still one subtree.
    fake.write(
        "crates/idem-server/src/b.rs",
        "pub fn helper() { tests::t() }\nmod tests {\n    use super::*;\n    pub fn t() { helper() }\n}\n",
    );
    assert!(fake.violations("circles").is_empty());
}

#[test]
fn a_longer_circle_among_siblings_fires() {
    let fake = Fake::new();
    fake.write(
        "crates/idem-server/src/main.rs",
        "mod a;\nmod b;\nmod c;\nfn main() {}\n",
    );
    fake.write("crates/idem-server/src/a.rs", "use crate::b::f;\n");
    fake.write(
        "crates/idem-server/src/b.rs",
        "pub fn f() { crate::c::g() }\n",
    );
    fake.write(
        "crates/idem-server/src/c.rs",
        "pub fn g() { super::a::h() }\n",
    );
    let v = fake.violations("circles");
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("a, b, c import each other (a circle among siblings)"),
        "{}",
        v[0]
    );
    // Broken anywhere, it is gone.
    fake.write("crates/idem-server/src/c.rs", "pub fn g() {}\n");
    assert!(fake.violations("circles").is_empty());
}

#[test]
fn circles_are_sought_in_every_crate_and_in_tests_trees() {
    let fake = Fake::new();
    fake.write("crates/idem-core/src/lib.rs", "mod x;\nmod y;\n");
    fake.write(
        "crates/idem-core/src/x.rs",
        "use crate::y::B;\npub struct A;\n",
    );
    fake.write(
        "crates/idem-core/src/y/mod.rs",
        "use crate::x::A;\npub struct B;\n",
    );
    fake.write("crates/idem-core/tests/it/main.rs", "mod p;\nmod q;\n");
    fake.write(
        "crates/idem-core/tests/it/p.rs",
        "use super::q::Q;\npub struct P;\n",
    );
    fake.write(
        "crates/idem-core/tests/it/q.rs",
        "use super::p::P;\npub struct Q;\n",
    );
    let v = fake.violations("circles");
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(
        v[0].contains("in crates/idem-core/src: x, y")
            && v[0].contains("crates/idem-core/src/y/mod.rs:1")
    );
    assert!(
        v[1].contains("in crates/idem-core/tests/it: p, q"),
        "{}",
        v[1]
    );
}

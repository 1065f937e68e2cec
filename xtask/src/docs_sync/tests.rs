//! The parser and the rewrite, on strings.

use super::*;

fn only(name: &str, text: &str) -> impl Fn(&str) -> Result<String, String> {
    let (name, text) = (name.to_owned(), text.to_owned());
    move |p| {
        if p == name {
            Ok(text.clone())
        } else {
            Err("no such file".into())
        }
    }
}

#[test]
fn a_marker_names_a_path_and_maybe_an_anchor() {
    assert_eq!(marker("<!-- example: a/b.rs -->"), Some(("a/b.rs", None)));
    assert_eq!(
        marker("  <!--example: a/b.rs#main-->"),
        Some(("a/b.rs", Some("main")))
    );
    assert_eq!(marker("<!-- example: -->"), None);
    assert_eq!(marker("<!-- a comment -->"), None);
    assert_eq!(marker("example: a.rs"), None);
}

#[test]
fn the_block_after_a_marker_is_found_with_its_content_range() {
    let md = "# T\n<!-- example: x.rs#one -->\n```rust\nfn a() {}\n```\ntail\n";
    let b = blocks(md).expect("parses");
    assert_eq!(b.len(), 1);
    assert_eq!(
        (b[0].line, b[0].path.as_str(), b[0].anchor.as_deref()),
        (2, "x.rs", Some("one"))
    );
    assert_eq!(&md[b[0].content.clone()], "fn a() {}\n");
}

#[test]
fn a_longer_fence_holds_shorter_ones_and_tildes_hold_backticks() {
    let md = "<!-- example: a.md -->\n````md\n```\ninner\n```\n````\n\
              <!-- example: b.rs -->\n~~~\n```\n~~~\n";
    let b = blocks(md).expect("parses");
    assert_eq!(&md[b[0].content.clone()], "```\ninner\n```\n");
    assert_eq!(&md[b[1].content.clone()], "```\n");
}

#[test]
fn a_marker_inside_a_code_block_is_text() {
    let md = "```md\n<!-- example: a.rs -->\n```\n";
    assert_eq!(blocks(md), Ok(vec![]));
}

#[test]
fn an_empty_block_has_an_empty_range() {
    let md = "<!-- example: a.rs -->\n```\n```\n";
    let b = blocks(md).expect("parses");
    assert_eq!(&md[b[0].content.clone()], "");
}

#[test]
fn a_marker_without_a_block_or_an_unclosed_block_is_an_error() {
    let gap = "<!-- example: a.rs -->\n\n```\nx\n```\n";
    assert_eq!(
        blocks(gap),
        Err("line 1: an example marker not directly followed by a code block".into())
    );
    let last = "text\n<!-- example: a.rs -->";
    assert!(blocks(last).is_err());
    let open = "<!-- example: a.rs -->\n```\nx\n";
    assert_eq!(
        blocks(open),
        Err("line 1: the example's code block is not closed".into())
    );
}

#[test]
fn a_region_is_between_its_anchors_less_every_anchor_line() {
    let file = "use a;\n// ANCHOR: main\nfn main() {\n    // ANCHOR: inner\n    go();\n    \
                // ANCHOR_END: inner\n}\n// ANCHOR_END: main\nrest\n";
    assert_eq!(
        region(file, Some("main")),
        Ok("fn main() {\n    go();\n}\n".into())
    );
    assert_eq!(region(file, Some("inner")), Ok("    go();\n".into()));
    assert_eq!(
        region(file, None),
        Ok("use a;\nfn main() {\n    go();\n}\nrest\n".into())
    );
    assert_eq!(
        region("x", None),
        Ok("x\n".into()),
        "a last line gets its newline"
    );
    assert_eq!(region(file, Some("nope")), Err("no anchor \"nope\"".into()));
    assert_eq!(
        region("// ANCHOR: a\nx\n", Some("a")),
        Err("anchor \"a\" has no ANCHOR_END".into())
    );
    assert_eq!(
        region("<!-- ANCHOR: a -->\nx\n<!-- ANCHOR_END: a -->\n", Some("a")),
        Ok("x\n".into())
    );
}

#[test]
fn a_stale_block_is_found_and_fixed_and_a_fresh_one_left_alone() {
    let file = "fn a() {}\n// ANCHOR: b\nfn b() {}\n// ANCHOR_END: b\n";
    let md = "<!-- example: f.rs -->\n```rust\nold\n```\n\
              <!-- example: f.rs#b -->\n```rust\nfn b() {}\n```\n";
    let (findings, fixed) = sync(md, only("f.rs", file)).expect("parses");
    assert_eq!(
        findings,
        [Finding {
            line: 1,
            what: "stale, differs from f.rs".into()
        }]
    );
    assert_eq!(
        fixed,
        "<!-- example: f.rs -->\n```rust\nfn a() {}\nfn b() {}\n```\n\
         <!-- example: f.rs#b -->\n```rust\nfn b() {}\n```\n"
    );
    let (again, same) = sync(&fixed, only("f.rs", file)).expect("parses");
    assert_eq!(
        (again, same.as_str()),
        (vec![], fixed.as_str()),
        "fixed is fresh"
    );
}

#[test]
fn a_missing_file_or_anchor_is_reported_not_fixed() {
    let md = "<!-- example: gone.rs -->\n```\nx\n```\n";
    let (findings, fixed) = sync(md, only("f.rs", "")).expect("parses");
    assert_eq!(
        findings,
        [Finding {
            line: 1,
            what: "gone.rs: no such file".into()
        }]
    );
    assert_eq!(fixed, md);
}

#[test]
fn paths_stay_under_the_root() {
    let root = Path::new("/nonexistent-root");
    assert!(read_under(root, "../etc/passwd").is_err_and(|e| e.contains("without `..`")));
    assert!(read_under(root, "/etc/passwd").is_err_and(|e| e.contains("relative")));
}

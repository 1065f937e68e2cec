//! Property: two JSON bodies get one fingerprint exactly when they are the
//! same JSON value, however each is spelled.
//!
//! Values are generated as trees with exact decimal numbers, then rendered in
//! randomly different but equivalent ways: member order, whitespace, number
//! spellings (`1.50`, `15e-1`, `0.15E1`), string escapes (`\u0041` for `A`,
//! `\/`, surrogate pairs) and duplicated keys whose last occurrence wins.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{Fingerprint, FingerprintSpec, RequestParts};
use crate::scope::Operation;

/// A JSON value; numbers are normalised exact decimals, so `==` is JSON value
/// equality.
#[derive(Debug, Clone, PartialEq)]
enum Tree {
    Null,
    Bool(bool),
    /// `(-1)^negative × digits × 10^exponent`; `digits` without leading or
    /// trailing zeros, zero as `("", 0)` without a sign.
    Num {
        negative: bool,
        digits: String,
        exponent: i32,
    },
    Str(String),
    Arr(Vec<Tree>),
    Obj(BTreeMap<String, Tree>),
}

fn number(negative: bool, digits: &str, exponent: i32) -> Tree {
    let trimmed = digits.trim_start_matches('0');
    let significant = trimmed.trim_end_matches('0');
    if significant.is_empty() {
        return Tree::Num {
            negative: false,
            digits: String::new(),
            exponent: 0,
        };
    }
    Tree::Num {
        negative,
        digits: significant.to_owned(),
        exponent: exponent + (trimmed.len() - significant.len()) as i32,
    }
}

fn digits() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..1000).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        // Long: beyond u64 and f64 precision, where near neighbours matter.
        proptest::collection::vec(0u8..10, 1..40)
            .prop_map(|d| d.into_iter().map(|d| char::from(b'0' + d)).collect()),
    ]
}

fn text(alphabet: &'static [char], len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(alphabet), len)
        .prop_map(|chars| chars.into_iter().collect())
}

const CHARS: &[char] = &[
    'a',
    'b',
    'A',
    ' ',
    '/',
    '"',
    '\\',
    '\n',
    '\t',
    '\u{0}',
    '\u{1f}',
    '\u{7f}',
    'é',
    '\u{2028}',
    '\u{ffff}',
    '😀',
    '\u{10ffff}',
];
const KEY_CHARS: &[char] = &['a', 'b', 'é', '"', '/', '~', '😀'];

fn tree() -> impl Strategy<Value = Tree> {
    let leaf = prop_oneof![
        Just(Tree::Null),
        any::<bool>().prop_map(Tree::Bool),
        (any::<bool>(), digits(), -30i32..30).prop_map(|(n, d, e)| number(n, &d, e)),
        text(CHARS, 0..5).prop_map(Tree::Str),
    ];
    leaf.prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Tree::Arr),
            proptest::collection::btree_map(text(KEY_CHARS, 0..3), inner, 0..5).prop_map(Tree::Obj),
        ]
    })
}

/// xorshift64: the rendering choices, from a seed proptest generates.
struct Choices(u64);

impl Choices {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn coin(&mut self) -> bool {
        self.below(2) == 0
    }

    fn pick<'a>(&mut self, options: &[&'a str]) -> &'a str {
        options[self.below(options.len())]
    }
}

fn ws(c: &mut Choices, out: &mut String) {
    out.push_str(c.pick(&["", "", " ", "\n", "\t", "\r\n  "]));
}

fn render(tree: &Tree, c: &mut Choices) -> String {
    let mut out = String::new();
    ws(c, &mut out);
    write(tree, c, &mut out);
    ws(c, &mut out);
    out
}

fn write(tree: &Tree, c: &mut Choices, out: &mut String) {
    match tree {
        Tree::Null => out.push_str("null"),
        Tree::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Tree::Num {
            negative,
            digits,
            exponent,
        } => write_number(*negative, digits, *exponent, c, out),
        Tree::Str(s) => write_string(s, c, out),
        Tree::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(c, out);
                write(item, c, out);
                ws(c, out);
            }
            if items.is_empty() {
                ws(c, out);
            }
            out.push(']');
        }
        Tree::Obj(map) => {
            let mut members: Vec<(&String, Option<&Tree>)> =
                map.iter().map(|(k, v)| (k, Some(v))).collect();
            // Earlier occurrences of a key, overridden by the real one.
            for k in map.keys() {
                if c.below(4) == 0 {
                    members.push((k, None));
                }
            }
            for i in (1..members.len()).rev() {
                members.swap(i, c.below(i + 1));
            }
            // Each key's real value goes last among its occurrences.
            let mut seen = std::collections::BTreeSet::new();
            for i in (0..members.len()).rev() {
                if seen.insert(members[i].0) && members[i].1.is_none() {
                    let key = members[i].0;
                    if let Some(j) = (0..i).find(|&j| members[j].0 == key && members[j].1.is_some())
                    {
                        members.swap(i, j);
                    }
                }
            }
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(c, out);
                write_string(k, c, out);
                ws(c, out);
                out.push(':');
                ws(c, out);
                match v {
                    Some(v) => write(v, c, out),
                    None => out.push_str(c.pick(&["null", "0", "\"shadowed\"", "[1]"])),
                }
                ws(c, out);
            }
            if members.is_empty() {
                ws(c, out);
            }
            out.push('}');
        }
    }
}

fn write_number(negative: bool, digits: &str, exponent: i32, c: &mut Choices, out: &mut String) {
    if digits.is_empty() {
        out.push_str(c.pick(&["0", "-0", "0.0", "-0.000", "0e5", "0E-2", "-0.0e+1"]));
        return;
    }
    if negative {
        out.push('-');
    }
    // m × 10^k with extra trailing zeros, then split into a positional part
    // m × 10^(k - e) and a written exponent e.
    let zeros = c.below(3);
    let m = format!("{digits}{}", "0".repeat(zeros));
    let k = exponent - zeros as i32;
    let e = k + c.below(7) as i32 - 3;
    let shift = k - e;
    let len = m.len() as i32;
    let mut positional = if shift >= 0 {
        format!("{m}{}", "0".repeat(shift as usize))
    } else if len > -shift {
        let (int, frac) = m.split_at((len + shift) as usize);
        format!("{int}.{frac}")
    } else {
        format!("0.{}{m}", "0".repeat((-shift - len) as usize))
    };
    if !positional.contains('.') && c.below(4) == 0 {
        positional.push_str(c.pick(&[".0", ".00"]));
    }
    out.push_str(&positional);
    if e != 0 || c.below(4) == 0 {
        out.push_str(c.pick(&["e", "E"]));
        out.push_str(if e < 0 { "-" } else { c.pick(&["", "+"]) });
        out.push_str(c.pick(&["", "0", "00"]));
        out.push_str(&e.unsigned_abs().to_string());
    }
}

fn write_string(s: &str, c: &mut Choices, out: &mut String) {
    fn unit(u: u16, c: &mut Choices, out: &mut String) {
        let hex = format!("{u:04x}");
        out.push_str("\\u");
        out.push_str(&if c.coin() { hex.to_uppercase() } else { hex });
    }
    fn escaped(ch: char, c: &mut Choices, out: &mut String) {
        let mut units = [0u16; 2];
        for &u in ch.encode_utf16(&mut units).iter() {
            unit(u, c, out);
        }
    }
    out.push('"');
    for ch in s.chars() {
        let short = match ch {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '/' => Some("\\/"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        let must_escape = matches!(ch, '"' | '\\' | '\u{0}'..='\u{1f}');
        match (short, c.below(3)) {
            (Some(short), 0 | 1) => out.push_str(short),
            (_, 0) => escaped(ch, c, out),
            _ if must_escape => escaped(ch, c, out),
            _ => out.push(ch),
        }
    }
    out.push('"');
}

fn fingerprint(body: &str) -> Fingerprint {
    let op = Operation::new("payments.create").unwrap();
    FingerprintSpec::default().fingerprint(&RequestParts {
        method: "POST",
        operation: &op,
        target: "/v1/payments",
        json: true,
        body: body.as_bytes(),
    })
}

/// The leaves (and empty containers) of a tree, depth first.
fn leaf_count(tree: &Tree) -> usize {
    match tree {
        Tree::Arr(items) if !items.is_empty() => items.iter().map(leaf_count).sum(),
        Tree::Obj(map) if !map.is_empty() => map.values().map(leaf_count).sum(),
        _ => 1,
    }
}

/// Changes the value of leaf `index` (modulo the count), always to a
/// different JSON value, often a near neighbour.
fn mutate(tree: &mut Tree, index: &mut usize, how: usize) -> bool {
    match tree {
        Tree::Arr(items) if !items.is_empty() => items.iter_mut().any(|t| mutate(t, index, how)),
        Tree::Obj(map) if !map.is_empty() => map.values_mut().any(|t| mutate(t, index, how)),
        _ if *index > 0 => {
            *index -= 1;
            false
        }
        leaf => {
            *leaf = match (&*leaf, how % 4) {
                (Tree::Null, _) => Tree::Bool(false),
                (Tree::Bool(b), _) => Tree::Bool(!b),
                (Tree::Str(s), 0) => Tree::Str(format!("{s}a")),
                (Tree::Str(s), _) if !s.is_empty() => {
                    let mut s = s.clone();
                    let last = s.pop().unwrap_or('a');
                    s.push(if last == 'b' { 'A' } else { 'b' });
                    Tree::Str(s)
                }
                (Tree::Str(_), _) => Tree::Str("\u{0}".into()),
                (Tree::Num { digits, .. }, _) if digits.is_empty() => number(how % 8 < 4, "1", 0),
                (
                    Tree::Num {
                        negative,
                        digits,
                        exponent,
                    },
                    m,
                ) => match m {
                    // The last significant digit: …616 becomes …617.
                    0 | 1 => {
                        let mut d = digits.clone();
                        let last = d.pop().map_or(1, |l| l as u8 - b'0');
                        d.push(char::from(b'0' + last % 9 + 1));
                        number(*negative, &d, *exponent)
                    }
                    // One more digit far below: 0.3 becomes 0.30000…01.
                    2 => number(
                        *negative,
                        &format!("{digits}{}1", "0".repeat(how % 20)),
                        exponent - 1 - (how % 20) as i32,
                    ),
                    _ => number(!negative, digits, *exponent),
                },
                (Tree::Arr(_), _) => Tree::Arr(vec![Tree::Null]),
                (Tree::Obj(_), _) => Tree::Obj(BTreeMap::from([(String::new(), Tree::Null)])),
            };
            true
        }
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn equivalent_renderings_have_one_fingerprint(t in tree(), s1: u64, s2: u64) {
        let a = render(&t, &mut Choices::new(s1));
        let b = render(&t, &mut Choices::new(s2));
        prop_assert!(
            FingerprintSpec::default().canonical_body(a.as_bytes()).is_some(),
            "refused: {a}"
        );
        prop_assert_eq!(fingerprint(&a), fingerprint(&b), "{} vs {}", a, b);
    }

    #[test]
    fn fingerprints_are_equal_exactly_when_values_are(
        t1 in tree(), t2 in tree(), s1: u64, s2: u64,
    ) {
        let a = render(&t1, &mut Choices::new(s1));
        let b = render(&t2, &mut Choices::new(s2));
        prop_assert_eq!(t1 == t2, fingerprint(&a) == fingerprint(&b), "{} vs {}", a, b);
    }

    #[test]
    fn changing_one_leaf_changes_the_fingerprint(
        t in tree(), leaf: usize, how: usize, s1: u64, s2: u64,
    ) {
        let mut changed = t.clone();
        let mut index = leaf % leaf_count(&t);
        prop_assert!(mutate(&mut changed, &mut index, how));
        prop_assert_ne!(&changed, &t);
        let a = render(&t, &mut Choices::new(s1));
        let b = render(&changed, &mut Choices::new(s2));
        prop_assert_ne!(fingerprint(&a), fingerprint(&b), "{} vs {}", a, b);
    }
}

//! The macro rule: a `macro_rules!` in a library crate that implements a
//! trait or writes a function, and the share of idem-sql's lines inside
//! `macro_rules!` definitions.

use super::lex::{Tok, Token, tokens};

/// One `macro_rules!` definition as the gate sees it.
#[derive(Debug)]
pub(crate) struct MacroDef {
    pub(crate) name: String,
    /// Lines of the definition: from the `macro_rules!` line to the line of
    /// its closing delimiter, both counted.
    pub(crate) first_line: usize,
    pub(crate) last_line: usize,
    /// Line of the first `impl … for` inside the body (a trait implemented).
    pub(crate) impl_for: Option<usize>,
    /// Line of the first `fn NAME` / `fn $name` inside the body (a function
    /// or method written).
    pub(crate) writes_fn: Option<usize>,
}

impl MacroDef {
    pub(crate) fn lines(&self) -> usize {
        self.last_line + 1 - self.first_line
    }
}

fn opens(t: &Token) -> bool {
    matches!(t.tok, Tok::Punct('{' | '(' | '['))
}

fn closes(t: &Token) -> bool {
    matches!(t.tok, Tok::Punct('}' | ')' | ']'))
}

/// Every `macro_rules! NAME { … }` (or `( … );`, `[ … ];`) in `src`.
pub(crate) fn macro_defs(src: &str) -> Vec<MacroDef> {
    let toks = tokens(src);
    let mut defs = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let is_def = toks[i].is_ident("macro_rules")
            && toks.get(i + 1).is_some_and(|t| t.is_punct('!'))
            && toks.get(i + 2).is_some_and(|t| t.ident().is_some())
            && toks.get(i + 3).is_some_and(opens);
        if !is_def {
            i += 1;
            continue;
        }
        let name = toks[i + 2].ident().unwrap_or_default().to_owned();
        let body_start = i + 4;
        let mut depth = 1usize;
        let mut j = body_start;
        while j < toks.len() && depth > 0 {
            if opens(&toks[j]) {
                depth += 1;
            } else if closes(&toks[j]) {
                depth -= 1;
            }
            j += 1;
        }
        // `j` is one past the closing delimiter (or the end of the file).
        let body = &toks[body_start..j.saturating_sub(1).max(body_start)];
        let last_line = toks[j.saturating_sub(1).max(i)].line;
        defs.push(MacroDef {
            name,
            first_line: toks[i].line,
            last_line,
            impl_for: impl_for(body),
            writes_fn: writes_fn(body),
        });
        i = j;
    }
    defs
}

/// The line of an `impl … for …` header: an `impl` followed, before the next
/// `{` or `;`, by a `for` that is not a higher-ranked `for<'a>`.
fn impl_for(body: &[Token]) -> Option<usize> {
    for (k, t) in body.iter().enumerate() {
        if !t.is_ident("impl") {
            continue;
        }
        for (m, u) in body[k + 1..].iter().enumerate() {
            if u.is_punct('{') || u.is_punct(';') {
                break;
            }
            let higher_ranked = body.get(k + 2 + m).is_some_and(|n| n.is_punct('<'));
            if u.is_ident("for") && !higher_ranked {
                return Some(t.line);
            }
        }
    }
    None
}

/// The line of a `fn NAME` or `fn $name`: a function written (a `fn(…)`
/// pointer type is not one).
fn writes_fn(body: &[Token]) -> Option<usize> {
    body.windows(2)
        .find(|w| w[0].is_ident("fn") && (w[1].ident().is_some() || w[1].is_punct('$')))
        .map(|w| w[0].line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_macro_implementing_a_trait_or_writing_a_fn_is_seen() {
        let src = "\
// macro_rules! not_this { }
macro_rules! store {
    ($t:ty) => {
        impl<D> KeyStore for $t where D: for<'a> Fn(&'a str) {
            fn get(&self) {}
        }
    };
}
macro_rules! methods {
    ($name:ident) => {
        pub async fn $name(&self) -> u8 { 1 }
    };
}
macro_rules! sql {
    (insert) => { \"INSERT INTO t (a) VALUES (?) -- impl x for y fn z\" };
    (ptr) => { type F = fn(u8) -> u8; };
}
";
        let defs = macro_defs(src);
        let got: Vec<_> = defs
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.first_line,
                    d.last_line,
                    d.impl_for,
                    d.writes_fn,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("store", 2, 8, Some(4), Some(5)),
                ("methods", 9, 13, None, Some(11)),
                ("sql", 14, 17, None, None),
            ]
        );
        assert_eq!(defs[0].lines(), 7);
    }

    #[test]
    fn a_higher_ranked_for_alone_is_not_an_impl_for() {
        let defs = macro_defs("macro_rules! m { () => { impl X where T: for<'a> Y<'a> { } } }");
        assert_eq!(defs[0].impl_for, None);
    }
}

//! A Rust source read as tokens, enough for the layout gate: identifiers,
//! `::`, and single punctuation characters, each with its line. Comments,
//! string, byte-string, raw-string and character literals, lifetimes and
//! numbers are dropped, so a `crate::x` inside a string or a comment is never
//! taken for a path. Not a full lexer: it does not need to be, and it never
//! fails (text it cannot read is skipped character by character).

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    /// An identifier or keyword (`r#type` is given as `type`).
    Ident(String),
    /// `::`
    PathSep,
    /// Any other punctuation character (`{`, `}`, `;`, `,`, `*`, `!`, …).
    Punct(char),
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    /// 1-based line.
    pub(crate) line: usize,
}

impl Token {
    pub(crate) fn is_ident(&self, s: &str) -> bool {
        matches!(&self.tok, Tok::Ident(i) if i == s)
    }

    pub(crate) fn is_punct(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }

    pub(crate) fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(i) => Some(i),
            _ => None,
        }
    }
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

pub(crate) fn tokens(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let n = chars.len();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < n {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < n && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            // Block comments nest in Rust.
            let mut depth = 0usize;
            while i < n {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1, &mut line);
        } else if let Some((start, hashes)) = matches!(c, 'r' | 'b' | 'c')
            .then(|| raw_or_prefixed_string(&chars, i))
            .flatten()
        {
            i = match hashes {
                Some(h) => skip_raw_string(&chars, start, h, &mut line),
                None => skip_string(&chars, start, &mut line),
            };
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 2;
                while i < n && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < n && is_ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while i < n
                && (is_ident_char(chars[i]) || chars[i] == '.' && at(i + 1).is_ascii_digit())
            {
                i += 1;
            }
        } else if is_ident_start(c) {
            let mut start = i;
            if c == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
                start = i + 2;
            }
            i = start;
            while i < n && is_ident_char(chars[i]) {
                i += 1;
            }
            out.push(Token {
                tok: Tok::Ident(chars[start..i].iter().collect()),
                line,
            });
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Token {
                tok: Tok::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// At a `r`, `b` or `c`: whether a string starts here (`r"`, `r#"`, `b"`,
/// `br"`, `br#"`, `c"`, `cr#"`, …), and where its text starts, with the number
/// of `#`s for a raw one.
fn raw_or_prefixed_string(chars: &[char], i: usize) -> Option<(usize, Option<usize>)> {
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    // Not the middle of an identifier such as `attr"`.
    if i > 0 && is_ident_char(chars[i - 1]) {
        return None;
    }
    let mut j = i;
    if at(j) == 'b' || at(j) == 'c' {
        j += 1;
    }
    if at(j) == 'r' {
        j += 1;
        let mut hashes = 0;
        while at(j) == '#' {
            hashes += 1;
            j += 1;
        }
        return (at(j) == '"').then_some((j + 1, Some(hashes)));
    }
    (j > i && at(j) == '"').then_some((j + 1, None))
}

fn skip_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                if chars.get(i + 1) == Some(&'\n') {
                    *line += 1;
                }
                i += 2;
            }
            '"' => return i + 1,
            '\n' => {
                *line += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

fn skip_raw_string(chars: &[char], mut i: usize, hashes: usize, line: &mut usize) -> usize {
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        if chars[i] == '\n' {
            *line += 1;
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        tokens(src)
            .into_iter()
            .filter_map(|t| t.ident().map(str::to_owned))
            .collect()
    }

    #[test]
    fn comments_strings_chars_and_lifetimes_are_not_tokens() {
        let src = r####"
            // use crate::in_line;
            /* crate::in_block /* nested crate::in_nested */ still crate::in_after */
            let s = "crate::in_str \" crate::in_escaped";
            let r = r#"crate::in_raw " crate::in_raw_quote"#;
            let b = br##"crate::in_bytes"##;
            let c = 'x'; let q = '\''; let u = '\u{41}';
            fn f<'a>(x: &'a str) {}
            keep::this
        "####;
        let ids = idents(src);
        for bad in [
            "in_line",
            "in_block",
            "in_nested",
            "in_after",
            "in_str",
            "in_escaped",
            "in_raw",
            "in_raw_quote",
            "in_bytes",
            "crate",
            "use",
        ] {
            assert!(!ids.contains(&bad.to_owned()), "{bad} leaked: {ids:?}");
        }
        assert!(ids.contains(&"keep".to_owned()) && ids.contains(&"this".to_owned()));
        assert!(ids.contains(&"str".to_owned()), "after a lifetime: {ids:?}");
    }

    #[test]
    fn lines_are_counted_through_multi_line_comments_and_strings() {
        let src = "/* one\ntwo */\n\"three\nfour\"\nr#\"five\n\"#\nhere";
        let t = tokens(src);
        assert_eq!(
            t.last().map(|t| (t.ident(), t.line)),
            Some((Some("here"), 7))
        );
    }

    #[test]
    fn raw_identifiers_and_path_separators() {
        let t = tokens("r#type::x");
        assert!(t[0].is_ident("type"));
        assert_eq!(t[1].tok, Tok::PathSep);
        assert!(t[2].is_ident("x"));
    }
}

//! Configuration file errors that never show a secret.
//!
//! `toml`'s own error text quotes the offending line, and serde's messages
//! quote the offending value (``invalid type: integer `12345`, expected a
//! string``): for a secret setting that would print the secret into a
//! terminal or a log. Errors are rewritten as `line L, column C: message`,
//! without the line; when the error is inside the value of a secret setting
//! the message is replaced altogether; and any secret value the file holds is
//! scrubbed from what remains.

use std::ops::Range;

/// Keys whose values are secrets, wherever they appear.
pub const SECRET_KEYS: &[&str] = &["secrets", "secret", "token", "admin_token", "password"];

/// The error, safe to print.
pub fn redacted(text: &str, error: &toml::de::Error) -> String {
    let span = error.span();
    let place = span
        .as_ref()
        .map(|s| {
            let (line, column) = line_column(text, s.start);
            format!("line {line}, column {column}: ")
        })
        .unwrap_or_default();
    if let Some((key, _)) = span.as_ref().and_then(|s| {
        secret_values(text)
            .into_iter()
            .find(|(_, r)| overlaps(r, s))
    }) {
        return format!(
            "{place}the value of `{key}` is not valid (not shown: the setting holds a secret)"
        );
    }
    // toml's syntax errors take several lines; one line here.
    let mut message = error
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    for secret in secret_strings(text) {
        // As serde writes a string value (`"…"`, escaped), quoted the other
        // ways toml and serde quote, and bare when it is long enough not to
        // be an ordinary word ("a" would eat every a).
        message = message.replace(&format!("{secret:?}"), "\"[redacted]\"");
        for (open, close) in [("`", "`"), ("\"", "\""), ("'", "'")] {
            message = message.replace(
                &format!("{open}{secret}{close}"),
                &format!("{open}[redacted]{close}"),
            );
        }
        if secret.chars().count() >= 8 {
            message = message.replace(&secret, "[redacted]");
            let escaped = format!("{secret:?}");
            message = message.replace(&escaped[1..escaped.len() - 1], "[redacted]");
        }
    }
    format!("{place}{message}")
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end.max(b.start + 1) && b.start < a.end
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The byte ranges of the values of secret keys, wherever the key is
/// written: on a line of its own, dotted (`webhooks.github.secrets = …`) or
/// inside an inline table (`github = { secrets = … }`). An array runs to its
/// closing bracket (across lines), a string to its closing quote, anything
/// else to the next `,`, `}` or end of line.
fn secret_values(text: &str) -> Vec<(&'static str, Range<usize>)> {
    let mut found = Vec::new();
    for &name in SECRET_KEYS {
        let mut from = 0;
        while let Some(at) = text[from..].find(name) {
            let start = from + at;
            from = start + name.len();
            let before = text[..start].chars().next_back();
            let boundary = before
                .is_none_or(|c| c.is_whitespace() || matches!(c, '.' | '{' | ',' | '"' | '\''));
            let rest = &text[from..];
            let rest = rest.strip_prefix(['"', '\'']).unwrap_or(rest);
            let after = rest.trim_start_matches([' ', '\t']);
            if !boundary || !after.starts_with('=') {
                continue;
            }
            let value_start = text.len() - after.len() + 1;
            found.push((name, value_start..value_end(text, value_start)));
        }
    }
    found
}

/// Where a value starting at `start` ends: at the bracket that closes an
/// array or the quote that closes a string (escapes and nested strings
/// skipped), else at a `,`, `}` or the end of the line.
fn value_end(text: &str, start: usize) -> usize {
    let rest = &text[start..];
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut seen_value = false;
    for (i, c) in rest.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q == '"' {
                escaped = true;
            } else if c == q {
                quote = None;
                if depth == 0 {
                    return start + i + 1;
                }
            }
            continue;
        }
        match c {
            '"' | '\'' => {
                quote = Some(c);
                seen_value = true;
            }
            '[' => {
                depth += 1;
                seen_value = true;
            }
            ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return start + i + 1;
                }
            }
            ',' | '}' if depth == 0 && seen_value => return start + i,
            '\n' if depth == 0 => return start + i,
            c if !c.is_whitespace() => seen_value = true,
            _ => {}
        }
    }
    text.len()
}

/// Every string value under a secret key, when the file parses as TOML.
fn secret_strings(text: &str) -> Vec<String> {
    fn walk(v: &toml::Value, secret: bool, out: &mut Vec<String>) {
        match v {
            toml::Value::String(s) if secret && !s.is_empty() => out.push(s.clone()),
            toml::Value::Array(items) => items.iter().for_each(|i| walk(i, secret, out)),
            toml::Value::Table(t) => t
                .iter()
                .for_each(|(k, v)| walk(v, secret || SECRET_KEYS.contains(&k.as_str()), out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        table
            .iter()
            .for_each(|(k, v)| walk(v, SECRET_KEYS.contains(&k.as_str()), &mut out));
    }
    // Longest first, so a secret that contains another is scrubbed whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct File {
        webhooks: std::collections::BTreeMap<String, Endpoint>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Endpoint {
        scheme: String,
        secrets: Vec<String>,
        forward_to: Option<String>,
    }

    fn error_of(text: &str) -> String {
        let e = toml::from_str::<File>(text).unwrap_err();
        redacted(text, &e)
    }

    #[test]
    fn a_bad_secret_value_is_not_shown() {
        for text in [
            "[webhooks.g]\nscheme = \"github\"\nsecrets = [\"s3cr3t-value\", 4242424242]\n",
            "[webhooks.g]\nscheme = \"github\"\nsecrets = [\n  \"s3cr3t-value\",\n  4242424242,\n]\n",
            "[webhooks.g]\nscheme = \"github\"\nsecrets = 4242424242\n",
            "[webhooks.g]\nscheme = \"github\"\nsecrets = [\"s3cr3t-value]\n",
        ] {
            let e = error_of(text);
            assert!(!e.contains("4242424242") && !e.contains("s3cr3t"), "{e}");
            assert!(e.starts_with("line "), "{e}");
        }
    }

    #[test]
    fn other_errors_keep_their_message_and_lose_the_secrets() {
        let text = "[webhooks.g]\nscheme = \"github\"\nsecrets = [\"s3cr3t-value\"]\nforward = \"s3cr3t-value\"\n";
        let e = error_of(text);
        assert!(e.contains("unknown field `forward`"), "{e}");
        assert!(e.starts_with("line 4, column 1: "), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        let e = error_of("[webhooks.g]\nscheme = 5\nsecrets = [\"s3cr3t-value\"]\n");
        assert!(e.contains("invalid type: integer `5`"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        // A short secret does not eat the letters of the message.
        let e = error_of("[webhooks.g]\nscheme = \"github\"\nsecrets = [\"a\"]\nforwrd = \"a\"\n");
        assert!(e.contains("unknown field `forwrd`, expected"), "{e}");
    }

    #[test]
    fn secrets_written_dotted_inline_or_with_escapes_are_not_shown() {
        for text in [
            "webhooks.github.scheme = \"github\"\nwebhooks.github.secrets = \"pa\\\"ss-word-123\"\n",
            "[webhooks]\ngithub = { scheme = \"github\", secrets = \"tr0ub4dor\\\\&3-horse\" }\n",
            "[webhooks]\ngithub = { scheme = \"github\", secrets = [\"s3cr3t-value\", 12345678] }\n",
            "[webhooks.g]\nscheme = \"github\"\n\"secrets\" = 4242424242\n",
        ] {
            let e = error_of(text);
            for leak in [
                "ss-word",
                "tr0ub4dor",
                "horse",
                "s3cr3t",
                "12345678",
                "4242424242",
            ] {
                assert!(!e.contains(leak), "{text:?} -> {e}");
            }
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn syntax_errors_are_one_line() {
        let e = error_of("[webhooks.g]\nscheme = \"github\"\nsecrets = [\"a\", \n");
        assert!(!e.contains('\n'), "{e}");
        assert!(e.starts_with("line "), "{e}");
    }

    #[test]
    fn positions_count_from_one() {
        assert_eq!(line_column("a\nbc\n", 0), (1, 1));
        assert_eq!(line_column("a\nbc\n", 3), (2, 2));
    }
}

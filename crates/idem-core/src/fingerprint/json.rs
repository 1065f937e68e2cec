//! The canonical JSON of a request body: a small, strict, bounded RFC 8259
//! reader and the writer of the one canonical spelling of each JSON value.
//!
//! Numbers are read from their lexical form into an exact [`Decimal`], never
//! through `f64`, so two different numbers never share a canonical form
//! however many digits they have, and equal numbers (`1`, `1.0`, `10e-1`)
//! always do.

use std::collections::BTreeMap;

/// The deepest nesting of arrays and objects read; deeper bodies are hashed as
/// raw bytes. `serde_json` refuses nesting of 128, so every body a serde-based
/// server accepts is read.
pub(super) const MAX_DEPTH: usize = 128;

/// The largest exponent magnitude, both as written and after normalisation;
/// a number beyond it sends the body to the raw-bytes fallback. It keeps the
/// arithmetic exact in an `i64` and the canonical exponent at most 9 digits.
pub(super) const EXPONENT_MAX: i64 = 999_999_999;

/// Integers with at most this many digits are written out in full, as every
/// `u64` and `i64` always was (and as JavaScript writes numbers below 1e21);
/// longer ones in scientific notation.
const PLAIN_DIGITS_MAX: i64 = 21;

/// A JSON value with exact numbers. Objects keep the last value of a
/// duplicated key, as serde-based servers do, and iterate in UTF-8 byte order
/// (the order of `str`'s `Ord`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Json {
    Null,
    Bool(bool),
    Number(Decimal),
    String(String),
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

/// An exact decimal `(-1)^negative × digits × 10^exponent`, normalised: no
/// leading or trailing zeros in `digits`, and zero is `("", 0)` without a sign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Decimal {
    negative: bool,
    digits: String,
    exponent: i64,
}

/// Reads one JSON text (RFC 8259: any value, surrounded by optional
/// whitespace). `None` for anything that is not exactly JSON or exceeds the
/// bounds above.
pub(super) fn parse(input: &[u8]) -> Option<Json> {
    let mut p = Parser { input, pos: 0 };
    p.skip_ws();
    let value = p.value(0)?;
    p.skip_ws();
    (p.pos == input.len()).then_some(value)
}

/// Writes the canonical form: no whitespace, object keys in UTF-8 byte order,
/// strings escaped as `serde_json` escapes them, numbers as [`write_number`].
pub(super) fn write(value: &Json, out: &mut Vec<u8>) {
    match value {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(true) => out.extend_from_slice(b"true"),
        Json::Bool(false) => out.extend_from_slice(b"false"),
        Json::Number(d) => write_number(d, out),
        Json::String(s) => write_string(s, out),
        Json::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(v, out);
            }
            out.push(b']');
        }
        Json::Object(map) => {
            out.push(b'{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write(v, out);
            }
            out.push(b'}');
        }
    }
}

/// Removes the member named by an RFC 6901 path (already split and unescaped),
/// if it exists. Array steps must be canonical indices (`0`, `17`, not `01`
/// or `+1`); only object members are removed.
pub(super) fn remove_path(value: &mut Json, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = value;
    for seg in parents {
        cur = match cur {
            Json::Object(map) => match map.get_mut(seg) {
                Some(v) => v,
                None => return,
            },
            Json::Array(items) => match array_index(seg).and_then(|i| items.get_mut(i)) {
                Some(v) => v,
                None => return,
            },
            _ => return,
        };
    }
    if let Json::Object(map) = cur {
        map.remove(last);
    }
}

fn array_index(seg: &str) -> Option<usize> {
    let canonical = seg == "0"
        || (seg.bytes().all(|b| b.is_ascii_digit()) && !seg.is_empty() && !seg.starts_with('0'));
    if canonical { seg.parse().ok() } else { None }
}

/// The one spelling of a number. For the numbers ordinary bodies carry it is
/// the spelling `serde_json` gave them before this reader existed, so stored
/// fingerprints stay valid (see `PREFIX` in the parent module):
///
/// - zero is `0` (also `-0`, `0.0`, `0e7`);
/// - an integer of at most 21 digits is written in full: `1000`, `-5`,
///   `18446744073709551616` (also for `1e3`, `1.0`, `10e-1`);
/// - a non-integer whose point falls within its first 21 digits is positional:
///   `12.34`, `0.30000000000000001`; one with at most 4 zeros after the point
///   before its first digit too: `0.00001`;
/// - anything else is scientific with one digit before the point and a signed
///   exponent: `1e-6`, `1.5e+300`, `1.2345678901234567890123e+22`.
///
/// Each is a JSON number whose exact value is the decimal's, so two different
/// values never share a spelling.
fn write_number(d: &Decimal, out: &mut Vec<u8>) {
    if d.digits.is_empty() {
        out.push(b'0');
        return;
    }
    if d.negative {
        out.push(b'-');
    }
    let digits = d.digits.as_bytes();
    // `digits` is at most a body long, so its length fits an i64.
    let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let k = d.exponent;
    // The value is in [10^(kk-1), 10^kk): `kk` is where the point falls.
    let kk = len.saturating_add(k);
    if k >= 0 && kk <= PLAIN_DIGITS_MAX {
        out.extend_from_slice(digits);
        push_zeros(out, k);
    } else if k < 0 && 0 < kk && kk <= PLAIN_DIGITS_MAX {
        // 0 < kk < len here, so the split is inside `digits`.
        let (int, frac) = digits.split_at(usize::try_from(kk).unwrap_or(0));
        out.extend_from_slice(int);
        out.push(b'.');
        out.extend_from_slice(frac);
    } else if k < 0 && -5 < kk && kk <= 0 {
        out.extend_from_slice(b"0.");
        push_zeros(out, -kk);
        out.extend_from_slice(digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.extend_from_slice(first);
        if !rest.is_empty() {
            out.push(b'.');
            out.extend_from_slice(rest);
        }
        let e = kk - 1;
        out.push(b'e');
        out.push(if e < 0 { b'-' } else { b'+' });
        out.extend_from_slice(e.unsigned_abs().to_string().as_bytes());
    }
}

fn push_zeros(out: &mut Vec<u8>, n: i64) {
    for _ in 0..n {
        out.push(b'0');
    }
}

/// Escapes exactly as `serde_json` does: `"`, `\` and the control characters
/// (short forms where JSON has them, else `\u00xx` in lowercase hex);
/// everything else, `/` and non-ASCII included, is written as UTF-8.
fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x00..=0x1f => b'u',
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.push(b'\\');
        out.push(short);
        if short == b'u' {
            out.extend_from_slice(b"00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let hit = self.peek() == Some(byte);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    /// RFC 8259 whitespace only: space, tab, line feed, carriage return.
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Option<Json> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(Json::String),
            b't' => self.literal(b"true", Json::Bool(true)),
            b'f' => self.literal(b"false", Json::Bool(false)),
            b'n' => self.literal(b"null", Json::Null),
            b'-' | b'0'..=b'9' => self.number().map(Json::Number),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8], value: Json) -> Option<Json> {
        let end = self.pos.checked_add(word.len())?;
        (self.input.get(self.pos..end)? == word).then(|| {
            self.pos = end;
            value
        })
    }

    fn object(&mut self, depth: usize) -> Option<Json> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.expect(b'{')?;
        let mut map = BTreeMap::new();
        self.skip_ws();
        if self.eat(b'}') {
            return Some(Json::Object(map));
        }
        loop {
            self.skip_ws();
            let key = self.string()?;
            self.skip_ws();
            self.expect(b':')?;
            self.skip_ws();
            let value = self.value(depth)?;
            // The last of duplicated keys wins, as in serde-based servers.
            map.insert(key, value);
            self.skip_ws();
            if !self.eat(b',') {
                self.expect(b'}')?;
                return Some(Json::Object(map));
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<Json> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.expect(b'[')?;
        let mut items = Vec::new();
        self.skip_ws();
        if self.eat(b']') {
            return Some(Json::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            if !self.eat(b',') {
                self.expect(b']')?;
                return Some(Json::Array(items));
            }
        }
    }

    /// A string: UTF-8 validated, escapes decoded, surrogate pairs joined,
    /// lone surrogates and unescaped control characters refused.
    fn string(&mut self) -> Option<String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // The run ends at an ASCII byte (or the end), so it holds whole
            // characters if the input is UTF-8 at all.
            out.push_str(std::str::from_utf8(&self.input[start..self.pos]).ok()?);
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.pos += 1;
                    out.push(self.escape()?);
                }
                _ => return None,
            }
        }
    }

    fn escape(&mut self) -> Option<char> {
        let b = self.peek()?;
        self.pos += 1;
        Some(match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4()?;
                match unit {
                    0xd800..=0xdbff => {
                        self.expect(b'\\')?;
                        self.expect(b'u')?;
                        let low = self.hex4()?;
                        if !(0xdc00..=0xdfff).contains(&low) {
                            return None;
                        }
                        char::from_u32(0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00))?
                    }
                    0xdc00..=0xdfff => return None,
                    _ => char::from_u32(unit)?,
                }
            }
            _ => return None,
        })
    }

    /// Exactly four hex digits (no sign, unlike `u32::from_str_radix`).
    fn hex4(&mut self) -> Option<u32> {
        let mut unit = 0;
        for _ in 0..4 {
            let digit = char::from(self.peek()?).to_digit(16)?;
            self.pos += 1;
            unit = unit * 16 + digit;
        }
        Some(unit)
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, read exactly.
    fn number(&mut self) -> Option<Decimal> {
        let negative = self.eat(b'-');
        let int_start = self.pos;
        match self.peek()? {
            b'0' => self.pos += 1,
            b'1'..=b'9' => self.skip_digits(),
            _ => return None,
        }
        let int = &self.input[int_start..self.pos];
        let mut frac: &[u8] = &[];
        if self.eat(b'.') {
            let start = self.pos;
            self.skip_digits();
            frac = &self.input[start..self.pos];
            if frac.is_empty() {
                return None;
            }
        }
        let mut written_exponent: i64 = 0;
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            let negative_exponent = match self.peek()? {
                b'-' => {
                    self.pos += 1;
                    true
                }
                b'+' => {
                    self.pos += 1;
                    false
                }
                _ => false,
            };
            let start = self.pos;
            self.skip_digits();
            let digits = &self.input[start..self.pos];
            if digits.is_empty() {
                return None;
            }
            for &d in digits {
                written_exponent = written_exponent * 10 + i64::from(d - b'0');
                if written_exponent > EXPONENT_MAX {
                    return None;
                }
            }
            if negative_exponent {
                written_exponent = -written_exponent;
            }
        }
        let all = || int.iter().chain(frac).copied();
        let leading = all().take_while(|&d| d == b'0').count();
        let total = int.len() + frac.len();
        if leading == total {
            return Some(Decimal {
                negative: false,
                digits: String::new(),
                exponent: 0,
            });
        }
        let trailing = all().rev().take_while(|&d| d == b'0').count();
        let digits: String = all()
            .skip(leading)
            .take(total - leading - trailing)
            .map(char::from)
            .collect();
        let shift = i64::try_from(trailing).ok()? - i64::try_from(frac.len()).ok()?;
        let exponent = written_exponent.checked_add(shift)?;
        if exponent.abs() > EXPONENT_MAX {
            return None;
        }
        Some(Decimal {
            negative,
            digits,
            exponent,
        })
    }

    fn skip_digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }
}

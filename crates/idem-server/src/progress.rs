//! Progress of long commands (`idem gc`, `idem webhooks replay --all`,
//! `idem bench`, `idem drill`) on stderr: on a terminal one bar redrawn in
//! place; otherwise plain lines, at most one a second for long runs, so a CI
//! log or a pipe gets a readable record and stdout stays the result alone.

use std::io::{IsTerminal, Stderr, Write};
use std::time::{Duration, Instant};

/// Redraws of the bar at most this often.
const REDRAW: Duration = Duration::from_millis(100);
/// Plain lines at most this often, once a run has more steps than
/// [`EVERY_STEP_UP_TO`].
const LINE_EVERY: Duration = Duration::from_secs(1);
/// Runs this short get a plain line for every step.
const EVERY_STEP_UP_TO: u64 = 100;
/// Width of the bar, in cells.
const BAR: usize = 24;
/// The longest name of a step shown.
const WHAT_MAX: usize = 60;

/// A progress report: `label`, how many steps are done, of how many when
/// that is known.
pub struct Progress<W: Write = Stderr> {
    out: W,
    tty: bool,
    label: String,
    total: Option<u64>,
    done: u64,
    /// When the bar was drawn or the last plain line written.
    last: Option<Instant>,
    /// Whether the bar is on screen (to be cleared before a line).
    drawn: bool,
}

impl Progress<Stderr> {
    /// On stderr: a bar when stderr is a terminal, plain lines otherwise.
    pub fn stderr(label: &str, total: Option<u64>) -> Self {
        let out = std::io::stderr();
        let tty = out.is_terminal();
        Self::to(out, tty, label, total)
    }
}

impl<W: Write> Progress<W> {
    /// On `out`, as a bar when `tty`.
    pub fn to(out: W, tty: bool, label: &str, total: Option<u64>) -> Self {
        Self {
            out,
            tty,
            label: clean(label),
            total,
            done: 0,
            last: None,
            drawn: false,
        }
    }

    /// Steps done so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// `n` more steps are done; `what` names the latest (or what is running
    /// now, with `n = 0`).
    pub fn advance(&mut self, n: u64, what: &str) {
        self.done = self.done.saturating_add(n);
        let now = Instant::now();
        let finished = self.total.is_some_and(|t| self.done >= t);
        if self.tty {
            if finished || self.last.is_none_or(|t| now.duration_since(t) >= REDRAW) {
                self.draw(what);
                self.last = Some(now);
            }
            return;
        }
        if n == 0 {
            return;
        }
        let every_step = self.total.is_some_and(|t| t <= EVERY_STEP_UP_TO);
        if every_step
            || finished
            || self
                .last
                .is_none_or(|t| now.duration_since(t) >= LINE_EVERY)
        {
            let line = format!("{}: {} {}", self.label, self.count(), clean(what));
            let _ = writeln!(self.out, "{}", line.trim_end());
            self.last = Some(now);
        }
    }

    /// `n` more steps are done and `text` says how they went: a line that
    /// stays, on a terminal and off it, in place of the plain count line.
    pub fn complete(&mut self, n: u64, text: &str) {
        self.done = self.done.saturating_add(n);
        self.line(text);
    }

    /// A line that stays (a result): on a terminal the bar is cleared
    /// first and drawn again after it.
    pub fn line(&mut self, text: &str) {
        if self.tty && self.drawn {
            let _ = write!(self.out, "\r\x1b[K");
            self.drawn = false;
        }
        let _ = writeln!(self.out, "{}", clean_line(text));
        let _ = self.out.flush();
    }

    /// Ends the report with `summary` (the bar, if any, is replaced by it).
    pub fn finish(&mut self, summary: &str) {
        self.line(&format!("{}: {}", self.label, clean_line(summary)));
    }

    /// Ends the report without a summary (an interrupted run): the bar
    /// stays on its own line.
    pub fn abandon(&mut self) {
        if self.tty && self.drawn {
            let _ = writeln!(self.out);
            self.drawn = false;
        }
    }

    fn count(&self) -> String {
        match self.total {
            Some(t) => format!("{}/{t}", self.done),
            None => self.done.to_string(),
        }
    }

    fn draw(&mut self, what: &str) {
        let bar = match self.total {
            Some(t) if t > 0 => {
                let filled = ((self.done.min(t) as f64 / t as f64) * BAR as f64).round() as usize;
                format!("[{}{}] ", "#".repeat(filled), "-".repeat(BAR - filled))
            }
            _ => String::new(),
        };
        let _ = write!(
            self.out,
            "\r\x1b[K{} {bar}{} {}",
            self.label,
            self.count(),
            clean(what)
        );
        let _ = self.out.flush();
        self.drawn = true;
    }
}

/// A step's name on one line, short, without control characters (names
/// can come from the database).
fn clean(text: &str) -> String {
    let mut s: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(WHAT_MAX)
        .collect();
    if text.chars().count() > WHAT_MAX {
        s.push('…');
    }
    s
}

/// A whole line without control characters.
fn clean_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: &Progress<Vec<u8>>) -> String {
        String::from_utf8_lossy(&p.out).into_owned()
    }

    #[test]
    fn not_a_terminal_gets_a_plain_line_per_step_of_a_short_run() {
        let mut p = Progress::to(Vec::new(), false, "drill", Some(3));
        p.advance(0, "baseline");
        p.advance(1, "baseline");
        p.advance(1, "lost_response");
        p.advance(1, "concurrency");
        p.finish("3 passed");
        assert_eq!(
            text(&p),
            "drill: 1/3 baseline\ndrill: 2/3 lost_response\ndrill: 3/3 concurrency\ndrill: 3 passed\n"
        );
        assert!(!text(&p).contains('\x1b'), "no escape codes off a terminal");
    }

    #[test]
    fn a_long_run_off_a_terminal_writes_at_most_one_line_a_second_and_the_last() {
        let mut p = Progress::to(Vec::new(), false, "replay", Some(1000));
        for _ in 0..1000 {
            p.advance(1, "hooks");
        }
        let t = text(&p);
        // The first step and the last: the loop takes far less than a second.
        assert_eq!(t, "replay: 1/1000 hooks\nreplay: 1000/1000 hooks\n");
    }

    #[test]
    fn a_terminal_gets_a_bar_redrawn_in_place_and_cleared_before_a_line() {
        let mut p = Progress::to(Vec::new(), true, "gc", Some(4));
        p.advance(2, "keys");
        p.line("a result");
        p.advance(2, "inbox");
        let t = text(&p);
        assert!(
            t.starts_with("\r\x1b[Kgc [############------------] 2/4 keys"),
            "{t:?}"
        );
        assert!(t.contains("\r\x1b[Ka result\n"), "{t:?}");
        assert!(
            t.ends_with("\r\x1b[Kgc [########################] 4/4 inbox"),
            "{t:?}"
        );
    }

    #[test]
    fn complete_writes_the_result_line_instead_of_the_count() {
        let mut p = Progress::to(Vec::new(), false, "drill", Some(2));
        p.advance(0, "baseline …");
        p.complete(1, "[1/2] baseline PASS");
        assert_eq!(p.done(), 1);
        assert_eq!(text(&p), "[1/2] baseline PASS\n");
        let mut p = Progress::to(Vec::new(), true, "drill", Some(2));
        p.advance(0, "baseline …");
        p.complete(1, "[1/2] baseline PASS");
        assert_eq!(
            text(&p),
            format!(
                "\r\x1b[Kdrill [{}] 0/2 baseline …\r\x1b[K[1/2] baseline PASS\n",
                "-".repeat(BAR)
            )
        );
    }

    #[test]
    fn an_unknown_total_counts_and_names_are_cleaned() {
        let mut p = Progress::to(Vec::new(), false, "gc", None);
        p.advance(1000, "key\x1b[31m records\n");
        assert_eq!(text(&p), "gc: 1000 key [31m records\n");
        let long = "x".repeat(200);
        let mut p = Progress::to(Vec::new(), false, "gc", None);
        p.advance(1, &long);
        assert_eq!(text(&p), format!("gc: 1 {}…\n", "x".repeat(WHAT_MAX)));
    }
}

//! A one-line progress bar on stderr, redrawn in place; drawn only when stderr is a
//! terminal (logs and pipes get nothing), so output meant for files stays clean.
use std::io::{IsTerminal, Write};
use std::time::Duration;

pub struct Progress {
    enabled: bool,
    drawn: bool,
}

impl Progress {
    pub fn new() -> Progress {
        Progress { enabled: std::io::stderr().is_terminal(), drawn: false }
    }

    /// Draws `done` of `total`, the time spent of `budget`, and what is being done.
    pub fn draw(&mut self, done: usize, total: usize, elapsed: Duration, budget: Duration, what: &str) {
        if !self.enabled {
            return;
        }
        const WIDTH: usize = 30;
        let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH).min(WIDTH);
        let what: String = what.chars().take(60).collect();
        let line = format!(
            "\r[{}{}] {done}/{total} keys, {:.0}/{:.0} s {what}",
            "#".repeat(filled),
            "-".repeat(WIDTH - filled),
            elapsed.as_secs_f64(),
            budget.as_secs_f64()
        );
        let mut e = std::io::stderr();
        let _ = write!(e, "{line:<120}");
        let _ = e.flush();
        self.drawn = true;
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if self.drawn {
            let mut e = std::io::stderr();
            let _ = write!(e, "\r{:<120}\r", "");
            let _ = e.flush();
            self.drawn = false;
        }
    }
}

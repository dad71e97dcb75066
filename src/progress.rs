//! Progress on stderr (indicatif) for whatever can take more than a second: tuning,
//! benchmark runs, a first run that specialises and compiles kernels. Drawn only when
//! stdout and stderr are terminals and the command prints text (not `--json`), so
//! output meant for files and pipes stays clean.
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

pub struct Progress {
    bar: ProgressBar,
    /// Drawn at all: a hidden bar's updates are skipped (benchmark loops call them).
    shown: bool,
}

/// Whether progress is drawn for a command printing `json` or text.
fn visible(json: bool) -> bool {
    !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

fn target(json: bool) -> ProgressDrawTarget {
    if visible(json) {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

impl Progress {
    /// A bar of `total` steps counted in `unit` ("runs", "keys"), with a message.
    pub fn bar(total: u64, unit: &str, json: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), target(json));
        let template = format!("[{{bar:30}}] {{pos}}/{{len}} {unit} {{elapsed}} {{msg}}");
        bar.set_style(ProgressStyle::with_template(&template).expect("a valid template").progress_chars("#>-"));
        Progress { bar, shown: visible(json) }
    }

    /// A spinner with a message, for a step of unknown length.
    pub fn spinner(message: &str, json: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(None, target(json));
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("a valid template"));
        bar.set_message(message.to_string());
        let shown = visible(json);
        if shown {
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        Progress { bar, shown }
    }

    /// Whether the bar is drawn (else a command may print its progress as lines).
    pub fn is_shown(&self) -> bool {
        self.shown
    }

    /// `done` steps of the total, and what is being done.
    pub fn set(&self, done: u64, message: &str) {
        if !self.shown {
            return;
        }
        self.bar.set_position(done);
        self.bar.set_message(message.chars().take(60).collect::<String>());
    }

    /// `done` steps of the total (no new message: cheap enough for a timed loop).
    pub fn position(&self, done: u64) {
        if self.shown {
            self.bar.set_position(done);
        }
    }

    /// Sets a new total (the tuner learns it as it goes).
    pub fn set_total(&self, total: u64) {
        if self.shown {
            self.bar.set_length(total);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

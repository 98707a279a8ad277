//! Progress of a run: one line rewritten in place on a terminal, plain lines otherwise (logs, CI,
//! pipes).

use std::io::{IsTerminal, Write};

/// Reports steps and epochs of one run.
pub struct Progress {
    name: String,
    enabled: bool,
    live: bool,
    log_every: usize,
    total_steps: usize,
    epochs: usize,
}

impl Progress {
    /// `enabled = false` prints nothing; on a terminal the step line is updated in place.
    pub fn new(name: &str, enabled: bool, total_steps: usize, epochs: usize, log_every: usize) -> Self {
        let live = enabled && std::io::stdout().is_terminal();
        Self { name: name.to_string(), enabled, live, log_every, total_steps, epochs }
    }

    /// A line of its own (above the live step line on a terminal).
    pub fn line(&self, text: &str) {
        if self.enabled {
            let clear = if self.live { "\r\x1b[2K" } else { "" };
            println!("{clear}{}: {text}", self.name);
        }
    }

    /// After optimizer step `step` (1-based) of `epoch` (1-based), with the mean loss of the last
    /// `log_every` steps and the samples per second so far.
    pub fn step(&self, step: usize, epoch: usize, recent_loss: f64, samples_per_second: f64, batch: usize) {
        if !self.enabled || !(self.live || step.is_multiple_of(self.log_every) || step == self.total_steps) {
            return;
        }
        let eta = (self.total_steps - step) as f64 * batch as f64 / samples_per_second.max(1e-9);
        let text = format!(
            "{}: epoch {epoch}/{} step {step}/{} loss {recent_loss:.5} {samples_per_second:.0} samples/s eta {eta:.0}s",
            self.name, self.epochs, self.total_steps
        );
        if self.live {
            print!("\r\x1b[2K{text}");
            std::io::stdout().flush().ok();
        } else {
            println!("{text}");
        }
    }

    /// Ends the live line.
    pub fn finish(&self) {
        if self.live {
            println!();
        }
    }
}

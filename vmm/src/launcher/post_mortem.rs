//! Why a VM is no longer running, read from what it left in its run folder.
//!
//! A guest that powers off or whose kernel panics takes its agent with it, and a
//! client sees only a lost connection. The serial console says what happened: the
//! kernel's last words are `reboot: Power down` after an orderly power-off and
//! `Kernel panic - not syncing` after a panic (the launcher boots with `panic=-1`, so
//! a panicked guest resets and QEMU exits, as `-no-reboot` asks). The folder stays
//! until the next boot sweeps it, so this can be asked after the fact.

use std::fmt;
use std::path::Path;

/// How a VM's guest ended, as far as its console tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEnd {
    /// An orderly power-off (a shutdown request, `poweroff`, or init exiting).
    PoweredOff,
    /// The guest kernel panicked.
    Panicked,
    /// QEMU is gone and the console does not say why (killed from outside, say).
    Unknown,
}

impl fmt::Display for GuestEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PoweredOff => "the guest powered off",
            Self::Panicked => "the guest kernel panicked",
            Self::Unknown => "QEMU is no longer running",
        })
    }
}

/// What a stopped VM left behind: how it ended and the end of its console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostMortem {
    /// How it ended.
    pub end: GuestEnd,
    /// The last lines of the serial console.
    pub console_tail: String,
}

impl PostMortem {
    /// Reads the console of the run folder `dir`.
    pub fn read(dir: &Path) -> Self {
        let console_tail = super::console_tail(dir);
        Self {
            end: classify(&console_tail),
            console_tail,
        }
    }

    /// At most `lines` lines of the console for a short report: from the panic
    /// message on after a panic (the call trace follows it), else the last ones.
    pub fn excerpt(&self, lines: usize) -> String {
        let all: Vec<&str> = self.console_tail.lines().collect();
        let start = match self.end {
            GuestEnd::Panicked => all
                .iter()
                .rposition(|line| line.contains("Kernel panic"))
                .unwrap_or(0),
            GuestEnd::PoweredOff | GuestEnd::Unknown => all.len().saturating_sub(lines),
        };
        all[start..]
            .iter()
            .take(lines)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The guest's end, from the console's last words (the last marker wins: a guest
/// that panicked while powering off panicked).
pub fn classify(console: &str) -> GuestEnd {
    let panic = console.rfind("Kernel panic");
    let power_off = console.rfind("reboot: Power down");
    match (panic, power_off) {
        (Some(p), Some(o)) if o > p => GuestEnd::PoweredOff,
        (Some(_), _) => GuestEnd::Panicked,
        (None, Some(_)) => GuestEnd::PoweredOff,
        (None, None) => GuestEnd::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_consoles_last_words_tell_how_the_guest_ended() {
        assert_eq!(
            classify("...\n[ 3.1] reboot: Power down\n"),
            GuestEnd::PoweredOff
        );
        assert_eq!(
            classify("[ 2.0] Kernel panic - not syncing: Attempted to kill init!\n"),
            GuestEnd::Panicked
        );
        assert_eq!(
            classify("Kernel panic - not syncing: x\nreboot: Power down\n"),
            GuestEnd::PoweredOff
        );
        assert_eq!(classify("booting...\n"), GuestEnd::Unknown);
    }

    #[test]
    fn the_excerpt_keeps_the_last_lines_or_starts_at_the_panic() {
        let report = PostMortem {
            end: GuestEnd::Unknown,
            console_tail: "a\nb\nc\nd\n".into(),
        };
        assert_eq!(report.excerpt(2), "c\nd");
        assert_eq!(report.excerpt(10), "a\nb\nc\nd");
        let console = "boot\nKernel panic - not syncing: x\ntrace 1\ntrace 2\ntrace 3\n";
        let report = PostMortem {
            end: classify(console),
            console_tail: console.into(),
        };
        assert_eq!(report.excerpt(2), "Kernel panic - not syncing: x\ntrace 1");
    }
}

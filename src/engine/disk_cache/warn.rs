//! Warnings about a condition that repeats for every block (an unwritable or full cache folder,
//! a failing disk): printed once per cause per minute, with how many were held back, instead of
//! once per block per request. Owned by the disk tier's I/O thread.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a cause stays quiet after its warning.
pub const QUIET: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Warner {
    /// Per cause: when it last warned, and the warnings held back since.
    last: HashMap<String, (Instant, u64)>,
}

impl Warner {
    /// The line to print for `cause` now, if any: None while the cause is quiet.
    pub fn line(&mut self, cause: &str, message: &str, now: Instant) -> Option<String> {
        match self.last.get_mut(cause) {
            Some((at, held)) if now.duration_since(*at) < QUIET => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let line = match *held {
                    0 => message.to_string(),
                    n => format!("{message} ({n} more like it in the last minute)"),
                };
                (*at, *held) = (now, 0);
                Some(line)
            }
            None => {
                self.last.insert(cause.to_string(), (now, 0));
                Some(message.to_string())
            }
        }
    }

    /// Prints `message` as a disk cache warning unless `cause` warned less than a minute ago.
    pub fn warn(&mut self, cause: &str, message: &str) {
        if let Some(line) = self.line(cause, message, Instant::now()) {
            eprintln!("warning: disk cache: {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unwritable_folder_warns_once_per_cause_per_minute_not_per_block() {
        let mut w = Warner::default();
        let t0 = Instant::now();
        let full = "writing: no space left on device";
        assert!(w.line("write:StorageFull", full, t0).is_some());
        for i in 1..100 {
            assert_eq!(
                w.line("write:StorageFull", full, t0 + Duration::from_millis(i)),
                None
            );
        }
        // Another cause has its own minute.
        assert!(w
            .line(
                "write:PermissionDenied",
                "denied",
                t0 + Duration::from_secs(1)
            )
            .is_some());
        let later = w.line("write:StorageFull", full, t0 + QUIET).unwrap();
        assert!(later.contains("99 more"), "{later}");
        assert_eq!(w.line("write:StorageFull", full, t0 + QUIET), None);
    }
}

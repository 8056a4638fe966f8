//! Memory admission at start-up: before the KV pool is allocated, what the engine will hold
//! (the KV pool, the weights, an estimate of the step's scratch buffers) is checked against
//! the memory this process can have: `MemAvailable` from /proc/meminfo, the address-space
//! limit (`RLIMIT_AS`, from /proc/self/limits) and the cgroup's `memory.max` (v2) or
//! `memory.limit_in_bytes` (v1). Too much is one error line naming the size, the limit and
//! the flag to change, instead of an allocation failure that aborts the process.
//! Called by `EngineHandle::start` for the CPU device (with the flag `EngineParts::memory_flag`
//! names).

use anyhow::{bail, Result};

/// What the engine will hold, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Footprint {
    pub kv: u64,
    /// The recurrent state slots (a model with recurrent layers; else 0).
    pub state: u64,
    /// The mapped file (the interleaved copies replace its pages as they are made).
    pub weights: u64,
    pub scratch: u64,
    /// The user consented to weights paged in from the file as steps read them
    /// (`--mmap-anyway`): they count against the address space, not against resident memory.
    pub weights_paged: bool,
}

impl Footprint {
    /// Both footprints held at once (a target model and its draft).
    pub fn plus(&self, other: &Footprint) -> Footprint {
        Footprint {
            kv: self.kv.saturating_add(other.kv),
            state: self.state.saturating_add(other.state),
            weights: self.weights.saturating_add(other.weights),
            scratch: self.scratch.saturating_add(other.scratch),
            weights_paged: self.weights_paged || other.weights_paged,
        }
    }

    pub fn total(&self) -> u64 {
        self.kv
            .saturating_add(self.state)
            .saturating_add(self.weights)
            .saturating_add(self.scratch)
    }
}

/// A limit on this process's memory, and where it was read.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub bytes: u64,
    pub source: &'static str,
    /// Whether the weights' address space counts twice against it (`RLIMIT_AS` counts the
    /// mapping and the copies, and every thread stack and library: `AS_SLACK` more).
    pub address_space: bool,
}

/// Address space that is not the engine's buffers (binary, libraries, thread stacks).
const AS_SLACK: u64 = 512 << 20;

/// The limits that are set here, tightest first.
pub fn limits() -> Vec<Limit> {
    let mut out = Vec::new();
    if let Some(kb) = meminfo_kb("MemAvailable:") {
        out.push(Limit {
            bytes: kb.saturating_mul(1024),
            source: "MemAvailable in /proc/meminfo",
            address_space: false,
        });
    }
    if let Some(bytes) = rlimit_as() {
        out.push(Limit {
            bytes,
            source: "RLIMIT_AS (ulimit -v)",
            address_space: true,
        });
    }
    if let Some(bytes) = cgroup_room() {
        out.push(Limit {
            bytes,
            source: "the cgroup's memory limit",
            address_space: false,
        });
    }
    out.sort_by_key(|l| l.bytes);
    out
}

/// Refuses a footprint that does not fit under every limit; `flag` names what to lower. Weights
/// that alone do not fit are refused apart, naming `--mmap-anyway` (a smaller pool cannot help).
pub fn admit(f: &Footprint, limits: &[Limit], flag: &str) -> Result<()> {
    for limit in limits {
        let need = if limit.address_space {
            f.total().saturating_add(f.weights).saturating_add(AS_SLACK)
        } else if f.weights_paged {
            f.total().saturating_sub(f.weights)
        } else {
            f.total()
        };
        if !limit.address_space && !f.weights_paged && f.weights > limit.bytes {
            bail!(
                "not enough memory for the weights: the model file is {}, but {} allows {}; every step reads all of it, so it would be paged in from disk again and again and decode would crawl. A smaller quantization fits, or --mmap-anyway starts anyway",
                size(f.weights),
                limit.source,
                size(limit.bytes),
            );
        }
        if need > limit.bytes {
            bail!(
                "not enough memory: the KV pool ({}){}, the weights ({}) and scratch buffers ({}) need {}{}, but {} allows {}; lower {flag}",
                size(f.kv),
                match f.state {
                    0 => String::new(),
                    s => format!(", the recurrent state slots ({})", size(s)),
                },
                size(f.weights),
                size(f.scratch),
                size(need),
                if limit.address_space { " of address space" } else { "" },
                limit.source,
                size(limit.bytes),
            );
        }
    }
    Ok(())
}

/// Bytes as MiB or GiB, for messages.
pub fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

fn meminfo_kb(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// The soft address-space limit, if one is set.
fn rlimit_as() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max address space"))?;
    let soft = line["Max address space".len()..]
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

/// Room left under the cgroup's memory limit (v2, else v1), if one is set.
fn cgroup_room() -> Option<u64> {
    let read = |p: &str| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let (max, current) = match read("/sys/fs/cgroup/memory.max") {
        Some(max) => (max, read("/sys/fs/cgroup/memory.current")),
        None => (
            read("/sys/fs/cgroup/memory/memory.limit_in_bytes")?,
            read("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
        ),
    };
    // v1 reports "no limit" as a huge number.
    if max >= 1 << 60 {
        return None;
    }
    Some(max.saturating_sub(current.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_what_fits_and_names_the_limit_and_flag_otherwise() {
        let f = Footprint {
            kv: 3 << 30,
            state: 0,
            weights: 100 << 20,
            scratch: 10 << 20,
            weights_paged: false,
        };
        let roomy = Limit {
            bytes: 8 << 30,
            source: "MemAvailable in /proc/meminfo",
            address_space: false,
        };
        assert!(admit(&f, std::slice::from_ref(&roomy), "--kv-mem").is_ok());
        let tight = Limit {
            bytes: 2 << 30,
            ..roomy
        };
        let e = admit(&f, &[tight], "--kv-mem").unwrap_err().to_string();
        assert!(
            e.contains("3.0 GiB") && e.contains("MemAvailable") && e.contains("--kv-mem"),
            "{e}"
        );
        // Under RLIMIT_AS the mapping and the copies both count, and the slack.
        let as_limit = Limit {
            bytes: (3 << 30) + (300 << 20),
            source: "RLIMIT_AS (ulimit -v)",
            address_space: true,
        };
        assert!(admit(&f, &[as_limit], "-c").is_err());
    }

    #[test]
    fn weights_larger_than_memory_are_refused_apart_unless_paging_is_consented_to() {
        let f = Footprint {
            kv: 64 << 20,
            state: 0,
            weights: 20 << 30,
            scratch: 10 << 20,
            weights_paged: false,
        };
        let ram = Limit {
            bytes: 16 << 30,
            source: "MemAvailable in /proc/meminfo",
            address_space: false,
        };
        let e = admit(&f, std::slice::from_ref(&ram), "--kv-mem")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("20.0 GiB") && e.contains("--mmap-anyway") && !e.contains("--kv-mem"),
            "{e}"
        );
        let paged = Footprint {
            weights_paged: true,
            ..f
        };
        assert!(admit(&paged, std::slice::from_ref(&ram), "--kv-mem").is_ok());
        // The pool still has to fit beside nothing but itself.
        let big_pool = Footprint {
            kv: 17 << 30,
            ..paged
        };
        let e = admit(&big_pool, &[ram], "--kv-mem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--kv-mem"), "{e}");
        // The mapping still takes address space.
        let as_limit = Limit {
            bytes: 8 << 30,
            source: "RLIMIT_AS (ulimit -v)",
            address_space: true,
        };
        assert!(admit(&paged, &[as_limit], "-c").is_err());
    }
}

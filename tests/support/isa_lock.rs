//! Switching the kernels' instruction set in a test: one test at a time (the ISA is
//! process-wide), and the ISA that was current restored afterwards, even when the test fails.

use std::sync::{Mutex, MutexGuard};

use edge_llm::kernels::{current_isa, set_isa, Isa};

static ISA_LOCK: Mutex<()> = Mutex::new(());

/// Holds the ISA lock and restores the ISA that was current when dropped.
pub struct IsaGuard {
    before: Isa,
    _lock: MutexGuard<'static, ()>,
}

impl Drop for IsaGuard {
    fn drop(&mut self) {
        set_isa(self.before).expect("the ISA that was current is available");
    }
}

pub fn lock_isa() -> IsaGuard {
    let lock = ISA_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    IsaGuard {
        before: current_isa(),
        _lock: lock,
    }
}

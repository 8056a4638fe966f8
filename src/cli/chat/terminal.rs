//! Terminal plumbing for `chat` on a TTY: a key mode in which a streaming reply can watch for
//! Ctrl+C and type-ahead without echo or line buffering, and a SIGINT flag so that Ctrl+C never
//! ends the program (it stops the reply instead). Called by the terminal loop in `super`.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::termios::{
    tcgetattr, tcsetattr, LocalFlags, SetArg, SpecialCharacterIndices, Termios,
};

/// Set when SIGINT arrives (Ctrl+C while the terminal is in its normal mode).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static HANDLER: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Catches SIGINT from now on: it sets a flag (see [`take_interrupt`]) instead of ending the
/// process. A thread with a small tokio runtime owns the handler.
pub fn catch_interrupts() -> Result<()> {
    let installed = HANDLER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("edge-llm-sigint".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return drop(tx.send(Err(e.to_string()))),
                };
                rt.block_on(async move {
                    use tokio::signal::unix::{signal, SignalKind};
                    match signal(SignalKind::interrupt()) {
                        Ok(mut sigint) => {
                            let _ = tx.send(Ok(()));
                            while sigint.recv().await.is_some() {
                                INTERRUPTED.store(true, Ordering::SeqCst);
                            }
                        }
                        Err(e) => drop(tx.send(Err(e.to_string()))),
                    }
                });
            });
        match spawned {
            Ok(_) => rx
                .recv()
                .unwrap_or_else(|_| Err("the signal thread ended".into())),
            Err(e) => Err(e.to_string()),
        }
    });
    installed
        .clone()
        .map_err(anyhow::Error::msg)
        .context("catching Ctrl+C")
}

/// Whether Ctrl+C was pressed since the last call.
pub fn take_interrupt() -> bool {
    INTERRUPTED.swap(false, Ordering::SeqCst)
}

/// Stdin in a mode where keys arrive one by one, unechoed, and Ctrl+C is the byte 3 (not a
/// signal); the previous mode comes back on drop. Output is unchanged.
pub struct KeyMode {
    saved: Termios,
}

impl KeyMode {
    pub fn enter() -> Result<KeyMode> {
        let stdin = std::io::stdin();
        let saved = tcgetattr(stdin.as_fd()).context("reading the terminal mode")?;
        let mut keys = saved.clone();
        keys.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG | LocalFlags::IEXTEN);
        keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 0;
        keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &keys).context("setting the terminal mode")?;
        Ok(KeyMode { saved })
    }

    /// The key bytes typed within `timeout_ms` (empty if none).
    pub fn read_keys(&self, timeout_ms: u16) -> Result<Vec<u8>> {
        let stdin = std::io::stdin();
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        let ready = match poll(&mut fds, PollTimeout::from(timeout_ms)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(e).context("waiting for keys"),
        };
        if ready == 0 {
            return Ok(Vec::new());
        }
        let mut buf = [0u8; 4096];
        match nix::unistd::read(stdin.as_fd(), &mut buf) {
            // The terminal hung up: as if Ctrl+D, so the prompt that follows sees the end.
            Ok(0) => Ok(vec![4]),
            Ok(n) => Ok(buf[..n].to_vec()),
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => Ok(Vec::new()),
            Err(e) => Err(e).context("reading keys"),
        }
    }
}

impl Drop for KeyMode {
    fn drop(&mut self) {
        let _ = tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

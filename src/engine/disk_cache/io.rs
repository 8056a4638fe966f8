//! Opening and writing files in a cache folder that others may write to (a shared
//! `--cache-dir`): no symbolic link is ever followed, a FIFO or device is never opened blocking
//! nor read, a file is measured before it is read, and a temporary file is created exclusively
//! under an unpredictable name before it is renamed into place. Used by the disk tier's block
//! files (`file`), its index scan and the model digest's record (`digest`).

use std::fmt;
use std::fs::File;
use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::libc;

/// Why a file in the cache folder was not read.
#[derive(Debug)]
pub enum Refused {
    NotFound,
    /// A symbolic link (never followed, wherever it points).
    Symlink,
    /// A FIFO, socket, device or directory.
    NotRegular(&'static str),
    /// Another I/O error (permissions, a failing disk).
    Io(io::Error),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::NotFound => write!(f, "not found"),
            Refused::Symlink => write!(f, "a symbolic link (never followed)"),
            Refused::NotRegular(kind) => write!(f, "not a regular file (a {kind})"),
            Refused::Io(e) => write!(f, "{e}"),
        }
    }
}

/// What kind of entry a file type is, for a warning.
pub fn kind_name(t: std::fs::FileType) -> &'static str {
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else if t.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

/// Opens `path` for reading if it is a regular file, itself (not through a link); returns it
/// with its length. Never blocks: a FIFO is opened non-blocking, then refused.
pub fn open_regular(path: &Path) -> Result<(File, u64), Refused> {
    let opened = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(Refused::NotFound),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Refused::Symlink),
        Err(e) => return Err(Refused::Io(e)),
    };
    let meta = file.metadata().map_err(Refused::Io)?;
    if !meta.file_type().is_file() {
        return Err(Refused::NotRegular(kind_name(meta.file_type())));
    }
    Ok((file, meta.len()))
}

/// Reads exactly `len` bytes of `file` (whose length was checked to be `len`).
pub fn read_exact(file: &mut File, len: usize) -> io::Result<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    file.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// A value no other process can guess: the standard library's per-process random keys, a
/// counter and the time.
fn unpredictable() -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = KEYS.get_or_init(Default::default).build_hasher();
    COUNTER.fetch_add(1, Ordering::Relaxed).hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    h.finish()
}

/// Writes `bytes` to `path` through a temporary file beside it (`<stem>.<pid>.<random>.tmp`,
/// created exclusively, no link followed), renamed into place: `path` is complete or absent,
/// and nothing but the new entry is written.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let tmp: PathBuf = path.with_file_name(format!(
        "{stem}.{}.{:016x}.tmp",
        std::process::id(),
        unpredictable()
    ));
    let written = File::options()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Takes the folder `dir` for this process: an exclusive lock on `dir/lock` (opened without
/// following a link), held as long as the returned file is open, with this process's id written
/// in it. Another process holding it is an error naming that process: a folder shared by two
/// servers would hold twice its budget, and each would delete the other's temporary files.
pub fn lock_folder(dir: &Path) -> anyhow::Result<File> {
    let path = dir.join("lock");
    let mut file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .mode(0o600)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
    if !file.metadata()?.is_file() {
        anyhow::bail!("{} is not a regular file", path.display());
    }
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = (&file).take(32).read_to_string(&mut holder);
            let holder = holder.trim();
            anyhow::bail!(
                "{} is in use by another edge-llm process{}: one process per folder keeps its \
                 budget (give this one its own --cache-dir)",
                dir.display(),
                if holder.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {holder})")
                }
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            anyhow::bail!("locking {}: {e}", path.display())
        }
    }
    file.set_len(0)?;
    writeln!(file, "{}", std::process::id())?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn dir(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("edge-llm-io-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }

    #[test]
    fn links_fifos_and_devices_are_refused_without_blocking() {
        let d = dir("refuse");
        let regular = d.0.join("a.kv");
        std::fs::write(&regular, b"12345").unwrap();
        assert_eq!(open_regular(&regular).unwrap().1, 5);
        let link = d.0.join("b.kv");
        std::os::unix::fs::symlink(&regular, &link).unwrap();
        assert!(matches!(open_regular(&link), Err(Refused::Symlink)));
        let zero = d.0.join("c.kv");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(matches!(open_regular(&zero), Err(Refused::Symlink)));
        assert!(matches!(
            open_regular(Path::new("/dev/zero")),
            Err(Refused::NotRegular("device"))
        ));
        let fifo = d.0.join("d.kv");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            open_regular(&fifo),
            Err(Refused::NotRegular("FIFO"))
        ));
        assert!(matches!(
            open_regular(&d.0.join("none.kv")),
            Err(Refused::NotFound)
        ));
    }

    #[test]
    fn writes_never_follow_a_planted_link_and_leave_no_temporary_file() {
        let d = dir("write");
        let victim = d.0.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let target = d.0.join("00ff.kv");
        // Links under every name a predictable scheme would use.
        std::os::unix::fs::symlink(
            &victim,
            d.0.join(format!("00ff.{}.tmp", std::process::id())),
        )
        .unwrap();
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        write_atomically(&target, b"block").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
        assert_eq!(std::fs::read(&target).unwrap(), b"block");
        let tmps = std::fs::read_dir(&d.0)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .count();
        assert_eq!(tmps, 1, "only the planted link is left");
    }
}

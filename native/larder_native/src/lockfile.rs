//! An exclusive advisory lock on a file, for a path that one holder at a
//! time may use (a replica's snapshot path): `flock(2)` through std's
//! `File::try_lock`. The lock belongs to the open file, which a resource
//! holds: it lasts until `file_lock_release/1` or until the resource is
//! freed (its process gone), and the kernel lets go of it when the VM dies
//! however it dies, SIGKILL included. So a lock is never left behind by a
//! dead holder, and two takers cannot both get it.
//!
//! The file is deleted by a clean release, while it is still locked. A
//! taker may have opened it just before (the same file, no longer at the
//! path), so a lock counts only when the file at the path is the file
//! locked (same device and inode, checked after locking, without following
//! a link); otherwise the taker is told `:locked` and tries again. A holder
//! that died leaves the file, which its next taker locks and checks as any
//! other.
//!
//! Only a lock file is ever written or deleted: the path is opened without
//! following a symbolic link (`O_NOFOLLOW`: a link there is `:eloop`), and
//! a file found there is written (truncated, then the holder's note) only
//! once it is proved to be a lock file: a regular file that is empty or
//! holds a note (`<digits> ...`, at most `MAX_NOTE` bytes). Anything else
//! (another program's file, a replica's manifest) is `:not_a_lock_file`,
//! and left as it was.

use rustler::{Atom, Binary, Encoder, Env, ResourceArc, Term};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Error, ErrorKind, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::atoms;

pub struct FileLock {
    /// The locked file and its path; `None` once released.
    held: Mutex<Option<(File, PathBuf)>>,
}

#[rustler::resource_impl]
impl rustler::Resource for FileLock {}

/// The largest note a lock file holds (an OS pid, a node name and a
/// replica's name): a larger file is not a lock file.
const MAX_NOTE: usize = 4096;

mod lock_atoms {
    rustler::atoms! {
        error,
        locked,
        not_a_lock_file,
        eacces,
        eperm,
        enoent,
        erofs,
        eisdir,
        enotdir,
        enospc,
        eloop,
        enametoolong,
        eio,
    }
}

fn posix(error: &Error) -> Atom {
    match error.raw_os_error() {
        Some(libc::EACCES) => lock_atoms::eacces(),
        Some(libc::EPERM) => lock_atoms::eperm(),
        Some(libc::ENOENT) => lock_atoms::enoent(),
        Some(libc::EROFS) => lock_atoms::erofs(),
        Some(libc::EISDIR) => lock_atoms::eisdir(),
        Some(libc::ENOTDIR) => lock_atoms::enotdir(),
        Some(libc::ENOSPC) => lock_atoms::enospc(),
        Some(libc::ELOOP) => lock_atoms::eloop(),
        Some(libc::ENAMETOOLONG) => lock_atoms::enametoolong(),
        _ => lock_atoms::eio(),
    }
}

/// Whether `file` is the file at `path` now (a link at the path is not).
fn at_path(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
        _ => false,
    }
}

/// Whether the locked `file` is a lock file: a regular file, empty or
/// holding a note (`<digits> ...`) of at most `MAX_NOTE` bytes. A note cut
/// short by a holder killed mid-write still starts so.
fn lock_file(file: &mut File) -> bool {
    match file.metadata() {
        Ok(meta) if meta.is_file() && meta.len() <= MAX_NOTE as u64 => {}
        _ => return false,
    }

    let mut head = Vec::with_capacity(MAX_NOTE + 1);
    if (&*file)
        .take(MAX_NOTE as u64 + 1)
        .read_to_end(&mut head)
        .is_err()
    {
        return false;
    }

    let digits = head.iter().take_while(|b| b.is_ascii_digit()).count();
    head.is_empty()
        || (head.len() <= MAX_NOTE && (1..=20).contains(&digits) && head.get(digits) == Some(&b' '))
}

/// Opens the file at `path` without following a link: for reading and
/// writing, creating it if it can, else (a file it may not write) for
/// reading, which is enough to lock it.
fn open(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .or_else(|error| match error.kind() {
            ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path),
            _ => Err(error),
        })
}

/// Opens (creating it if it can, never through a link) and locks the file
/// at `path`, without waiting, and writes `note` in it (who holds it; best
/// effort): `{:ok, lock}`, `{:error, :locked}` when another open file holds
/// the lock (in this VM or another process) or the file was just replaced,
/// `{:error, :not_a_lock_file}` when the file there is not a lock file (it
/// is left as it was), or `{:error, posix}` when it cannot be opened
/// (`:eloop` for a symbolic link). Runs on a dirty I/O scheduler (a file
/// system can be slow).
#[rustler::nif(schedule = "DirtyIo")]
fn file_lock<'a>(env: Env<'a>, path: Binary<'a>, note: Binary<'a>) -> Term<'a> {
    let path = Path::new(OsStr::from_bytes(path.as_slice()));

    let mut file = match open(path) {
        Ok(file) => file,
        Err(error) => return (lock_atoms::error(), posix(&error)).encode(env),
    };

    match file.try_lock() {
        // A file its holder deleted on release: closing it lets it go.
        Ok(()) if !at_path(&file, path) => (lock_atoms::error(), lock_atoms::locked()).encode(env),
        Ok(()) if !lock_file(&mut file) => {
            (lock_atoms::error(), lock_atoms::not_a_lock_file()).encode(env)
        }
        Ok(()) => {
            // Best effort: only for the message of a refused taker.
            let _ = file
                .set_len(0)
                .and_then(|()| file.write_all_at(note.as_slice(), 0));
            let lock = ResourceArc::new(FileLock {
                held: Mutex::new(Some((file, path.to_path_buf()))),
            });
            (atoms::ok(), lock).encode(env)
        }
        Err(TryLockError::WouldBlock) => (lock_atoms::error(), lock_atoms::locked()).encode(env),
        Err(TryLockError::Error(error)) => (lock_atoms::error(), posix(&error)).encode(env),
    }
}

/// Lets go of the lock now: deletes the file (if it is still the one at
/// its path) and then closes it. `:ok`, also when it was already released.
#[rustler::nif(schedule = "DirtyIo")]
fn file_lock_release(lock: ResourceArc<FileLock>) -> Atom {
    // Nothing panics while the mutex is held; a poisoned one still holds
    // an Option that is safe to take.
    let held = lock.held.lock().unwrap_or_else(|e| e.into_inner()).take();

    if let Some((file, path)) = held {
        if at_path(&file, &path) {
            // A read-only directory keeps it: the next taker locks it as is.
            let _ = std::fs::remove_file(&path);
        }
        drop(file);
    }

    atoms::ok()
}

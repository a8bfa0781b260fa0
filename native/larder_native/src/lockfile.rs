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
//! locked (same device and inode, checked after locking); otherwise the
//! taker is told `:locked` and tries again. A holder that died leaves the
//! file, which its next taker locks and checks as any other.

use rustler::{Atom, Binary, Encoder, Env, ResourceArc, Term};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::atoms;

pub struct FileLock {
    /// The locked file and its path; `None` once released.
    held: Mutex<Option<(File, PathBuf)>>,
}

#[rustler::resource_impl]
impl rustler::Resource for FileLock {}

mod lock_atoms {
    rustler::atoms! {
        error,
        locked,
        eacces,
        enoent,
        erofs,
        eisdir,
        enotdir,
        enospc,
        eio,
    }
}

fn posix(kind: ErrorKind) -> Atom {
    match kind {
        ErrorKind::PermissionDenied => lock_atoms::eacces(),
        ErrorKind::NotFound => lock_atoms::enoent(),
        ErrorKind::ReadOnlyFilesystem => lock_atoms::erofs(),
        ErrorKind::IsADirectory => lock_atoms::eisdir(),
        ErrorKind::NotADirectory => lock_atoms::enotdir(),
        ErrorKind::StorageFull => lock_atoms::enospc(),
        _ => lock_atoms::eio(),
    }
}

/// Whether `file` is the file at `path` now.
fn at_path(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
        _ => false,
    }
}

/// Opens (creating it if it can) and locks the file at `path`, without
/// waiting, and writes `note` in it (who holds it; best effort): `{:ok,
/// lock}`, `{:error, :locked}` when another open file holds the lock (in
/// this VM or another process) or the file was just replaced, or `{:error,
/// posix}` when the file cannot be opened. A file that exists but cannot be
/// written (a read-only directory or disk) is opened for reading, which is
/// enough to lock it. Runs on a dirty I/O scheduler (a file system can be
/// slow).
#[rustler::nif(schedule = "DirtyIo")]
fn file_lock<'a>(env: Env<'a>, path: Binary<'a>, note: Binary<'a>) -> Term<'a> {
    let path = Path::new(OsStr::from_bytes(path.as_slice()));

    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .or_else(|error| match error.kind() {
            ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => {
                OpenOptions::new().read(true).open(path)
            }
            _ => Err(error),
        });

    let mut file = match opened {
        Ok(file) => file,
        Err(error) => return (lock_atoms::error(), posix(error.kind())).encode(env),
    };

    match file.try_lock() {
        Ok(()) if at_path(&file, path) => {
            // Best effort: only for the message of a refused taker.
            let _ = file
                .set_len(0)
                .and_then(|()| file.write_all(note.as_slice()));
            let lock = ResourceArc::new(FileLock {
                held: Mutex::new(Some((file, path.to_path_buf()))),
            });
            (atoms::ok(), lock).encode(env)
        }
        // A file its holder deleted on release: closing it lets it go.
        Ok(()) | Err(TryLockError::WouldBlock) => {
            (lock_atoms::error(), lock_atoms::locked()).encode(env)
        }
        Err(TryLockError::Error(error)) => (lock_atoms::error(), posix(error.kind())).encode(env),
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

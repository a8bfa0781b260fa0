//! What every NIF body runs under: a panic (a bug here or in a crate below)
//! becomes `{:error, {:panic, message}}` instead of reaching the VM, and
//! `NifError` becomes its `{:error, _}` term.

use crate::atoms;
use crate::error::NifError;
use rustler::{Encoder, Env, Term};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub fn run<'a, F>(env: Env<'a>, body: F) -> Term<'a>
where
    F: FnOnce() -> Result<Term<'a>, NifError>,
{
    // AssertUnwindSafe: after a panic nothing the closure touched is used
    // again but the resources' mutexes, which every caller takes through
    // `lock()` (a poisoned mutex is taken over: its state is a client
    // handle and counters, valid between any two statements).
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(term)) => term,
        Ok(Err(err)) => err.encode(env),
        Err(payload) => {
            let message = if let Some(s) = payload.downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = payload.downcast_ref::<String>() {
                s.clone()
            } else {
                "a panic in the Kafka NIF".to_string()
            };
            NifError::ours(atoms::panic, message).encode(env)
        }
    }
}

/// Locks a mutex, taking it over if a panic poisoned it.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Drops `value` on a thread of its own: closing a librdkafka client waits
/// for its threads (and, for a consumer, for the broker), which must not
/// happen on the scheduler that runs a resource's destructor. Runs inline
/// only if no thread can be started.
pub fn drop_off_scheduler<T: Send + 'static>(value: T) {
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(value)));
    let theirs = slot.clone();
    let spawned = std::thread::Builder::new()
        .name("larder_kafka_close".into())
        .spawn(move || drop(lock(&theirs).take()));
    if spawned.is_err() {
        drop(lock(&slot).take());
    }
}

/// `Ok(term)` as a shorthand for NIF bodies.
pub fn ok<'a>(env: Env<'a>, value: impl Encoder) -> Result<Term<'a>, NifError> {
    Ok((atoms::ok(), value).encode(env))
}

/// `Larder.Kafka.Native.loaded?/0`: the Elixir stub raises, this answers.
#[rustler::nif]
fn nif_loaded() -> bool {
    true
}

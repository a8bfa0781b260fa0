//! Telling a process that the consumer queue has something to read, so
//! that it can read with no wait (never blocking a scheduler nor itself)
//! and still hear of new records at once, with no timer polling.
//!
//! librdkafka calls a queue's event callback when an op is put into the
//! queue while it is empty, from whichever thread enqueues (its broker
//! threads, or a scheduler thread of ours that calls into librdkafka),
//! with the queue's lock held. The callback only flips flags under a
//! mutex of its own and signals a thread of ours, which does the
//! `enif_send` (a message cannot be sent with no environment from a thread
//! the VM manages). The message is sent once per `arm`: a process arms,
//! reads until the queue is empty, arms again.

use crate::guard::lock;
use rdkafka::bindings as rdsys;
use rustler::{Encoder, LocalPid, OwnedEnv};
use std::os::raw::c_void;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

rustler::atoms! {
    larder_source_ready,
}

#[derive(Default)]
struct Flags {
    /// Who gets the message, set by `arm`.
    pid: Option<LocalPid>,
    /// A message is owed on the next enqueue.
    armed: bool,
    /// A message is to be sent by the thread.
    fired: bool,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    flags: Mutex<Flags>,
    cond: Condvar,
}

pub struct Waker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Waker {
    /// A waker whose thread sends the messages; None if no thread can be
    /// started.
    pub fn start() -> Option<Waker> {
        let shared = Arc::new(Shared::default());
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("larder_kafka_wake".into())
            .spawn(move || send_loop(&theirs))
            .ok()?;
        Some(Waker {
            shared,
            thread: Some(thread),
        })
    }

    /// The pointer the event callback gets: valid while `self` lives.
    pub fn opaque(&self) -> *mut c_void {
        Arc::as_ptr(&self.shared) as *mut c_void
    }

    /// Owes `pid` a message on the next enqueue into the (empty) queue.
    pub fn arm(&self, pid: LocalPid) {
        let mut flags = lock(&self.shared.flags);
        flags.pid = Some(pid);
        flags.armed = true;
    }

    /// Takes back an `arm` (the queue was found not empty after it):
    /// a message may still come if the callback fired in between.
    pub fn disarm(&self) {
        lock(&self.shared.flags).armed = false;
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        lock(&self.shared.flags).stop = true;
        self.shared.cond.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn send_loop(shared: &Shared) {
    let mut env = OwnedEnv::new();
    loop {
        let pid = {
            let mut flags = lock(&shared.flags);
            while !flags.fired && !flags.stop {
                flags = shared
                    .cond
                    .wait(flags)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if flags.stop {
                return;
            }
            flags.fired = false;
            flags.pid
        };
        if let Some(pid) = pid {
            // A process that is gone is not an error here.
            let _ = env.send_and_clear(&pid, |env| larder_source_ready().encode(env));
        }
    }
}

/// The queue's event callback.
///
/// # Safety
/// Called by librdkafka with the `opaque` given to
/// rd_kafka_queue_cb_event_enable: a `Shared` that outlives the callback's
/// registration (the registration is removed before the Waker drops).
pub unsafe extern "C" fn on_event(_rk: *mut rdsys::rd_kafka_t, opaque: *mut c_void) {
    if opaque.is_null() {
        return;
    }
    let shared = &*(opaque as *const Shared);
    let mut flags = lock(&shared.flags);
    if flags.armed {
        flags.armed = false;
        flags.fired = true;
        shared.cond.notify_one();
    }
}

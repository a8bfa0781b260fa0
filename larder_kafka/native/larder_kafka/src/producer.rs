//! The producer resource, for tests, benchmarks and the demo: records go
//! out with `nif_produce/6` or `nif_produce_batch/3` and
//! `nif_producer_flush/2` waits for them and returns the `{partition,
//! offset}` of each acknowledged since the last flush. A producer opened
//! with a `transactional.id` writes in transactions, driven step by step
//! by `nif_producer_transaction/3`.

use crate::atoms;
use crate::config;
use crate::error::NifError;
use crate::guard::{self, lock};
use rdkafka::bindings as rdsys;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};
use rdkafka::ClientContext;
use rustler::{Atom, Binary, Encoder, Env, ResourceArc, Term};
use std::os::raw::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The most records one batch call takes.
const MAX_BATCH: usize = 100_000;
/// The most acknowledgements kept between two flushes.
const MAX_ACKS: usize = 10_000_000;

/// The producer's context: what the delivery callback collects, kept until
/// a flush returns it (a flush that times out or fails leaves it here), and
/// the signal that wakes a flush when an event reaches the main queue.
#[derive(Default)]
pub struct Acks {
    acked: Mutex<Vec<(i32, i64)>>,
    failed: Mutex<Option<(RDKafkaErrorCode, String, usize)>>,
    events: Signal,
}

/// A counter of events enqueued on an empty main queue, and a condition
/// variable a flush waits on for it to change.
#[derive(Default)]
struct Signal {
    count: Mutex<u64>,
    changed: Condvar,
}

/// librdkafka's queue callback: an event (a delivery report) reached the
/// producer's empty main queue. Called on one of librdkafka's threads.
///
/// # Safety
/// `opaque` points to the `Signal` of a live `Acks`, which outlives the
/// client (the context is dropped after the client is destroyed).
unsafe extern "C" fn wake(_rk: *mut rdsys::rd_kafka_t, opaque: *mut c_void) {
    let signal = &*(opaque as *const Signal);
    // No panic may cross into C: lock() takes a poisoned mutex over, and
    // nothing else here can panic; catch_unwind is the last guard.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut count = lock(&signal.count);
        *count = count.wrapping_add(1);
        signal.changed.notify_all();
    }));
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(message) => {
                let mut acked = lock(&self.acked);
                if acked.len() < MAX_ACKS {
                    acked.push((message.partition(), message.offset()));
                }
            }
            Err((err, _)) => {
                let mut failed = lock(&self.failed);
                let code = err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
                match failed.as_mut() {
                    Some((_, _, n)) => *n += 1,
                    None => *failed = Some((code, err.to_string(), 1)),
                }
            }
        }
    }
}

pub struct Producer {
    producer: Mutex<Option<Open>>,
}

// Fields drop in order: the queue handle before the client it belongs to.
struct Open {
    main_queue: MainQueue,
    producer: BaseProducer<Acks>,
}

/// Our reference to the producer's main queue (where delivery reports
/// arrive), with the wake-up callback set on it.
struct MainQueue(*mut rdsys::rd_kafka_queue_t);

// SAFETY: a librdkafka queue handle may be used and destroyed from any
// thread (librdkafka locks the queue itself); this one is only used under
// the resource's mutex.
unsafe impl Send for MainQueue {}

impl Drop for MainQueue {
    fn drop(&mut self) {
        // SAFETY: the pointer came from rd_kafka_queue_get_main, is not null
        // (checked when made) and is destroyed once, here, after the
        // callback is removed.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.0, None, std::ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.0);
        }
    }
}

#[rustler::resource_impl]
impl rustler::Resource for Producer {}

impl Drop for Producer {
    fn drop(&mut self) {
        if let Some(open) = lock(&self.producer).take() {
            guard::drop_off_scheduler(open);
        }
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_producer_open<'a>(env: Env<'a>, config: Term<'a>) -> Term<'a> {
    guard::run(env, || {
        let config = config::decode(config, &[("linger.ms", "5")], &[])?;
        let producer: BaseProducer<Acks> = config.create_with_context(Acks::default())?;
        // SAFETY: native_ptr is the live client owned by `producer`; the
        // queue handle is released by MainQueue::drop before `producer` is
        // dropped (field order of Open); the callback's opaque is the
        // context's Signal, which lives until after the client is destroyed.
        let main_queue = unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) };
        if main_queue.is_null() {
            return Err(NifError::ours(
                atoms::config,
                "the client has no main queue",
            ));
        }
        let main_queue = MainQueue(main_queue);
        let signal: *const Signal = &producer.context().events;
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(main_queue.0, Some(wake), signal as *mut c_void)
        };
        let resource = ResourceArc::new(Producer {
            producer: Mutex::new(Some(Open {
                main_queue,
                producer,
            })),
        });
        guard::ok(env, resource)
    })
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_producer_close<'a>(env: Env<'a>, producer: ResourceArc<Producer>) -> Term<'a> {
    guard::run(env, || {
        if let Some(open) = lock(&producer.producer).take() {
            guard::drop_off_scheduler(open);
        }
        Ok(atoms::ok().encode(env))
    })
}

type Headers<'a> = Vec<(Binary<'a>, Option<Binary<'a>>)>;

fn send(
    producer: &BaseProducer<Acks>,
    topic: &str,
    partition: i32,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &Headers,
) -> Result<(), NifError> {
    let mut owned = OwnedHeaders::new_with_capacity(headers.len());
    for (name, val) in headers {
        let name = std::str::from_utf8(name.as_slice())
            .map_err(|_| NifError::bad_arg("a header name is not UTF-8"))?;
        owned = owned.insert(Header {
            key: name,
            value: val.as_ref().map(|v| v.as_slice()),
        });
    }
    // A full queue is waited out (polling serves the acknowledgements that
    // empty it), up to 30 s.
    let started = Instant::now();
    loop {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).headers(owned.clone());
        if partition >= 0 {
            record = record.partition(partition);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                if started.elapsed() < Duration::from_secs(30) =>
            {
                producer.poll(Duration::from_millis(10));
            }
            Err((err, _)) => return Err(err.into()),
        }
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_produce<'a>(
    env: Env<'a>,
    producer: ResourceArc<Producer>,
    topic: Binary<'a>,
    partition: i32,
    key: Option<Binary<'a>>,
    value: Option<Binary<'a>>,
    headers: Headers<'a>,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        let guard = lock(&producer.producer);
        let p = &guard.as_ref().ok_or_else(NifError::closed)?.producer;
        send(
            p,
            topic,
            partition,
            key.as_ref().map(|b| b.as_slice()),
            value.as_ref().map(|b| b.as_slice()),
            &headers,
        )?;
        p.poll(Duration::ZERO);
        Ok(atoms::ok().encode(env))
    })
}

/// Sends `[{partition, key, value, headers}]` to `topic`.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_produce_batch<'a>(
    env: Env<'a>,
    producer: ResourceArc<Producer>,
    topic: Binary<'a>,
    records: Vec<(i32, Option<Binary<'a>>, Option<Binary<'a>>, Headers<'a>)>,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        if records.len() > MAX_BATCH {
            return Err(NifError::bad_arg("more than 100000 records in one batch"));
        }
        let guard = lock(&producer.producer);
        let p = &guard.as_ref().ok_or_else(NifError::closed)?.producer;
        for (partition, key, value, headers) in &records {
            send(
                p,
                topic,
                *partition,
                key.as_ref().map(|b| b.as_slice()),
                value.as_ref().map(|b| b.as_slice()),
                headers,
            )?;
        }
        p.poll(Duration::ZERO);
        Ok(atoms::ok().encode(env))
    })
}

/// Waits up to `timeout_ms` for every record sent to be acknowledged:
/// `{:ok, [{partition, offset}]}` of those acknowledged since the last
/// flush that returned them, or the first delivery error. A flush that
/// times out or fails returns none: they stay for the next flush. It
/// returns as soon as the last outstanding record is acknowledged (a
/// delivery report reaching the main queue wakes it).
#[rustler::nif(schedule = "DirtyIo")]
fn nif_producer_flush<'a>(
    env: Env<'a>,
    producer: ResourceArc<Producer>,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let guard = lock(&producer.producer);
        let open = guard.as_ref().ok_or_else(NifError::closed)?;
        let all_acked = flush(open, config::timeout(timeout_ms));
        let context = open.producer.context();
        if let Some((code, message, n)) = lock(&context.failed).take() {
            return Err(NifError::code(
                code,
                format!("{n} record(s) not delivered: {message}"),
            ));
        }
        if !all_acked {
            return Err(NifError::code(
                RDKafkaErrorCode::OperationTimedOut,
                "flush timed out: records are still waiting for their acknowledgement",
            ));
        }
        let acks = std::mem::take(&mut *lock(&context.acked));
        guard::ok(env, acks)
    })
}

/// One step of a transaction, on a producer opened with a
/// `transactional.id`, waiting up to `timeout_ms`: `:init` (once, before
/// the first transaction: fences an older producer of the same id and ends
/// its open transaction), `:begin`, `:commit` (flushes first) or `:abort`.
/// `:ok` or librdkafka's error. A producer closed inside a transaction
/// sends neither a commit nor an abort: to the broker it is a producer that
/// died, and the transaction stays open until its `transaction.timeout.ms`.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_producer_transaction<'a>(
    env: Env<'a>,
    producer: ResourceArc<Producer>,
    step: Atom,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let guard = lock(&producer.producer);
        let open = guard.as_ref().ok_or_else(NifError::closed)?;
        let timeout = config::timeout(timeout_ms);
        let p = &open.producer;
        if step == atoms::init() {
            p.init_transactions(timeout)?;
        } else if step == atoms::begin() {
            p.begin_transaction()?;
        } else if step == atoms::commit() {
            p.commit_transaction(timeout)?;
        } else if step == atoms::abort() {
            p.abort_transaction(timeout)?;
        } else {
            return Err(NifError::bad_arg(
                "a transaction step is :init, :begin, :commit or :abort",
            ));
        }
        Ok(atoms::ok().encode(env))
    })
}

/// Serves the delivery reports until nothing is in flight (true) or
/// `timeout` has passed (false). The reports waiting in the main queue are
/// served first, so a zero timeout still collects those that arrived.
fn flush(open: &Open, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let signal = &open.producer.context().events;
    // SAFETY: the client is live (owned by `open`). A zero-time flush only
    // wakes the brokers so that records waiting out linger.ms go now.
    unsafe { rdsys::rd_kafka_flush(open.producer.client().native_ptr(), 0) };
    loop {
        let seen = *lock(&signal.count);
        serve(open);
        if open.producer.in_flight_count() == 0 {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        // An event enqueued since `seen` was read changed the count: then
        // serve again at once. The wait is cut to 100 ms in case a wake-up
        // is missed (the callback fires only on an empty queue).
        let count = lock(&signal.count);
        if *count == seen {
            let wait = (deadline - now).min(Duration::from_millis(100));
            let _ = signal
                .changed
                .wait_timeout(count, wait)
                .map_err(|poisoned| poisoned.into_inner());
        }
    }
}

/// Serves every event waiting in the main queue (delivery reports call
/// Acks::delivery), leaving it empty so that the next event wakes a flush.
fn serve(open: &Open) {
    // Bounded: events keep coming while records are acknowledged.
    for _ in 0..1_000_000 {
        // SAFETY: the queue handle is live (owned by `open`).
        if unsafe { rdsys::rd_kafka_queue_length(open.main_queue.0) } == 0 {
            return;
        }
        open.producer.poll(Duration::ZERO);
    }
}

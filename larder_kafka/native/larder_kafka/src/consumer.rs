//! The consumer resource behind `Larder.Replica.Kafka`: a librdkafka
//! consumer with partitions assigned directly (no group membership, no
//! commits), polled in batches by `consumer_poll/4` on a dirty I/O
//! scheduler. The batch is read from librdkafka's consumer queue (every
//! assigned partition's fetch queue forwards to it) and turned into
//! Erlang terms here, one `{{partition, offset}, {:kafka_record, key,
//! value, headers, timestamp, partition, offset}}` per record: tuples, no
//! map (a map per record was most of a poll's cost).
//!
//! Positions are tracked here rather than asked of librdkafka: the next
//! offset of a partition is the offset after its last record handed out,
//! or the offset of its last end-of-partition event if that is further
//! (librdkafka's fetch position at the end of the log, which is past
//! transaction markers and aborted records that are never handed out).
//! An end-of-partition event follows the partition's earlier records in
//! the queue, so it never moves a position past a record not yet read.

use crate::atoms;
use crate::config;
use crate::error::NifError;
use crate::guard::{self, lock};
use crate::wake::{self, Waker};
use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rustler::types::tuple::make_tuple;
use rustler::{Binary, Encoder, Env, LocalPid, NewBinary, ResourceArc, Term};
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::os::raw::c_void;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most records one poll returns.
pub const MAX_POLL: usize = 100_000;
/// The largest record (key + value + headers) one poll copies.
const MAX_RECORD_CAP: usize = 1 << 30;

pub struct Consumer {
    state: Mutex<Option<State>>,
    /// librdkafka's log lines, taken from its log queue by the calls that
    /// hold `state` and handed to Elixir's Logger by `consumer_logs/1`
    /// (which takes only this lock, never waiting on a poll).
    logs: Mutex<LogBuf>,
}

/// The most log lines kept between two `consumer_logs/1`; later ones are
/// counted.
const MAX_LOG_LINES: usize = 100;
/// The most bytes of one log line kept.
const MAX_LOG_TEXT: usize = 1_024;

#[derive(Default)]
struct LogBuf {
    lines: Vec<(i32, String, String)>,
    dropped: u64,
    /// librdkafka's last broker connection failure (a `FAIL` line: "SSL
    /// handshake failed ...", "Connect to ... failed: Connection refused")
    /// since the last metadata or watermark request that succeeded, for
    /// `consumer_failure/1`: the cause behind a request's "Broker transport
    /// failure". Kept whatever `lines` holds.
    failure: Option<String>,
}

#[rustler::resource_impl]
impl rustler::Resource for Consumer {}

impl Drop for Consumer {
    fn drop(&mut self) {
        // Closing waits for librdkafka's threads: never on the scheduler
        // that runs this destructor.
        if let Some(state) = lock(&self.state).take() {
            guard::drop_off_scheduler(state);
        }
    }
}

// Fields drop in order: the queue handles before the client they belong to.
struct State {
    queue: Queue,
    /// librdkafka's log queue: its log lines come here instead of to the
    /// consumer queue, where librdkafka's batch call would print them to
    /// the VM's stderr (its default log callback).
    log_queue: Queue,
    consumer: BaseConsumer,
    topic: Option<String>,
    positions: BTreeMap<i32, i64>,
    pending: Option<NifError>,
    /// Made by the first `consumer_notify/2`; dropped last, after the
    /// queue's callback is removed (State::drop).
    waker: Option<Waker>,
}

impl Drop for State {
    fn drop(&mut self) {
        if self.waker.is_some() {
            // SAFETY: the queue is live (dropped after this); removing the
            // callback takes the queue's lock, which the callback runs
            // under, so no call of it is under way once this returns and
            // the waker it points to can go.
            unsafe {
                rdsys::rd_kafka_queue_cb_event_enable(self.queue.0, None, std::ptr::null_mut())
            }
        }
    }
}

/// Our reference to librdkafka's consumer queue.
struct Queue(*mut rdsys::rd_kafka_queue_t);

// SAFETY: a librdkafka queue handle may be used and destroyed from any
// thread (librdkafka locks the queue itself); this one is only used under
// the resource's mutex.
unsafe impl Send for Queue {}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the pointer came from rd_kafka_queue_get_consumer, is not
        // null (checked when made) and is destroyed once, here.
        unsafe { rdsys::rd_kafka_queue_destroy(self.0) }
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_consumer_open<'a>(env: Env<'a>, config: Term<'a>) -> Term<'a> {
    guard::run(env, || {
        let config = config::decode(
            config,
            // A group id is needed to assign partitions; no group is joined
            // (we never subscribe) and no offset is committed.
            &[("group.id", "larder"), ("fetch.wait.max.ms", "10")],
            &[
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("enable.partition.eof", "true"),
                ("auto.offset.reset", "error"),
            ],
        )?;
        let consumer: BaseConsumer = config.create()?;
        // SAFETY: native_ptr is the live client owned by `consumer`; the
        // returned queue holds its own reference, released by Queue::drop
        // before `consumer` is dropped (field order of State).
        let queue = unsafe { rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        if queue.is_null() {
            return Err(NifError::ours(
                atoms::config,
                "the client has no consumer queue",
            ));
        }
        let queue = Queue(queue);
        // SAFETY: as above; the new queue is released by Queue::drop before
        // `consumer` is dropped, and librdkafka keeps its own reference to
        // the queue it forwards the log to until the client is destroyed.
        let log_queue = unsafe { rdsys::rd_kafka_queue_new(consumer.client().native_ptr()) };
        if log_queue.is_null() {
            return Err(NifError::ours(atoms::config, "no log queue"));
        }
        let log_queue = Queue(log_queue);
        let err =
            unsafe { rdsys::rd_kafka_set_log_queue(consumer.client().native_ptr(), log_queue.0) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(NifError::ours(atoms::config, "cannot set the log queue"));
        }
        // Log lines logged before the log queue was set went to the main
        // queue, which forwards to the consumer queue: taken from there now
        // (nothing else is in it before an assignment).
        let logs = Mutex::new(LogBuf::default());
        drain_logs(&queue, &logs);
        let state = State {
            queue,
            log_queue,
            consumer,
            topic: None,
            positions: BTreeMap::new(),
            pending: None,
            waker: None,
        };
        let resource = ResourceArc::new(Consumer {
            state: Mutex::new(Some(state)),
            logs,
        });
        guard::ok(env, resource)
    })
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_consumer_close<'a>(env: Env<'a>, consumer: ResourceArc<Consumer>) -> Term<'a> {
    guard::run(env, || {
        // Closing waits for librdkafka's threads and its queue to drain:
        // on a thread of its own, so that no scheduler waits on a broker.
        if let Some(state) = lock(&consumer.state).take() {
            guard::drop_off_scheduler(state);
        }
        Ok(atoms::ok().encode(env))
    })
}

/// `{:ok, %{partitions: [p], topic_id: binary | nil}}`.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_consumer_metadata<'a>(
    env: Env<'a>,
    consumer: ResourceArc<Consumer>,
    topic: Binary<'a>,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        let guard = lock(&consumer.state);
        let state = guard.as_ref().ok_or_else(NifError::closed)?;
        let timeout = config::timeout(timeout_ms);
        let started = Instant::now();
        let metadata = state.consumer.fetch_metadata(Some(topic), timeout);
        drain_logs(&state.log_queue, &consumer.logs);
        let metadata = metadata?;
        lock(&consumer.logs).failure = None;
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(NifError::ours(atoms::unknown_topic, "no such topic"));
        };
        if let Some(err) = t.error() {
            let code: rdkafka::types::RDKafkaErrorCode = err.into();
            return Err(NifError::code(code, format!("metadata of {topic}: {code}")));
        }
        let mut partitions: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        partitions.sort_unstable();
        let left = timeout.saturating_sub(started.elapsed());
        let id = topic_id(state.consumer.client().native_ptr(), topic, left);
        let id_term = match id {
            Some(id) => id.encode(env),
            None => atoms::nil().encode(env),
        };
        let map = Term::map_from_term_arrays(
            env,
            &[
                atoms::partitions().encode(env),
                atoms::topic_id().encode(env),
            ],
            &[partitions.encode(env), id_term],
        )
        .map_err(|_| NifError::bad_arg("metadata map"))?;
        guard::ok(env, map)
    })
}

/// The topic's id (base64, as Kafka's tools print it) by DescribeTopics,
/// or None when the broker does not answer in time or has none.
fn topic_id(rk: *mut rdsys::rd_kafka_t, topic: &str, timeout: Duration) -> Option<String> {
    let name = std::ffi::CString::new(topic).ok()?;
    let ms = timeout.as_millis().clamp(1, 600_000) as i32;
    // SAFETY: `rk` is a live client (its owner is borrowed by the caller
    // under the resource's mutex). Every object made here is destroyed
    // before returning; the result event owns the descriptions read from it
    // and is destroyed after the id is copied out.
    unsafe {
        let names = [name.as_ptr()];
        let collection =
            rdsys::rd_kafka_TopicCollection_of_topic_names(names.as_ptr() as *mut _, 1);
        let queue = rdsys::rd_kafka_queue_new(rk);
        let options = rdsys::rd_kafka_AdminOptions_new(
            rk,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        let mut id = None;
        if !collection.is_null() && !queue.is_null() && !options.is_null() {
            let mut errstr = [0 as std::os::raw::c_char; 256];
            rdsys::rd_kafka_AdminOptions_set_request_timeout(
                options,
                ms,
                errstr.as_mut_ptr(),
                errstr.len(),
            );
            rdsys::rd_kafka_DescribeTopics(rk, collection, options, queue);
            let event = rdsys::rd_kafka_queue_poll(queue, ms.saturating_add(100));
            if !event.is_null() {
                let result = rdsys::rd_kafka_event_DescribeTopics_result(event);
                if !result.is_null() {
                    let mut count = 0usize;
                    let topics = rdsys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
                    if !topics.is_null() && count >= 1 {
                        let description = *topics;
                        let err = rdsys::rd_kafka_TopicDescription_error(description);
                        if err.is_null() || rdsys::rd_kafka_error_code(err) as i32 == 0 {
                            let uuid = rdsys::rd_kafka_TopicDescription_topic_id(description);
                            if !uuid.is_null() {
                                let text = rdsys::rd_kafka_Uuid_base64str(uuid);
                                if !text.is_null() {
                                    id = Some(CStr::from_ptr(text).to_string_lossy().into_owned());
                                }
                            }
                        }
                    }
                }
                rdsys::rd_kafka_event_destroy(event);
            }
        }
        if !options.is_null() {
            rdsys::rd_kafka_AdminOptions_destroy(options);
        }
        if !queue.is_null() {
            rdsys::rd_kafka_queue_destroy(queue);
        }
        if !collection.is_null() {
            rdsys::rd_kafka_TopicCollection_destroy(collection);
        }
        id
    }
}

/// `{:ok, {low, high}}`.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_consumer_watermarks<'a>(
    env: Env<'a>,
    consumer: ResourceArc<Consumer>,
    topic: Binary<'a>,
    partition: i32,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        let guard = lock(&consumer.state);
        let state = guard.as_ref().ok_or_else(NifError::closed)?;
        let watermarks =
            state
                .consumer
                .fetch_watermarks(topic, partition, config::timeout(timeout_ms));
        drain_logs(&state.log_queue, &consumer.logs);
        let (low, high) = watermarks?;
        lock(&consumer.logs).failure = None;
        guard::ok(env, (low, high))
    })
}

/// Assigns `[{partition, next_offset}]` of `topic` (an offset of -1 reads
/// the partition from its start), replacing any earlier assignment.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_consumer_assign<'a>(
    env: Env<'a>,
    consumer: ResourceArc<Consumer>,
    topic: Binary<'a>,
    offsets: Vec<(i32, i64)>,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        if offsets.len() > 100_000 {
            return Err(NifError::bad_arg("more than 100000 partitions"));
        }
        let mut guard = lock(&consumer.state);
        let state = guard.as_mut().ok_or_else(NifError::closed)?;
        let mut tpl = TopicPartitionList::with_capacity(offsets.len());
        let mut positions = BTreeMap::new();
        for &(partition, offset) in &offsets {
            if partition < 0 || offset < -1 {
                return Err(NifError::bad_arg(
                    "a partition below 0 or an offset below -1",
                ));
            }
            let at = if offset == -1 {
                Offset::Beginning
            } else {
                positions.insert(partition, offset);
                Offset::Offset(offset)
            };
            tpl.add_partition_offset(topic, partition, at)?;
        }
        state.consumer.assign(&tpl)?;
        state.topic = Some(topic.to_string());
        state.positions = positions;
        state.pending = None;
        Ok(atoms::ok().encode(env))
    })
}

/// `{:ok, entries, positions, oversize}`: up to `max` records, waiting up
/// to `block_ms` for the first one; `positions` is `[{partition,
/// next_offset}]` for every partition whose position is known; `oversize`
/// is `[{partition, offset, bytes}]` of records over `max_record_bytes`,
/// not copied (their positions are passed). A partition's error (such as
/// `:offset_out_of_range`) is `{:error, {code, partition, message}}`,
/// returned after the records read before it; records of the same batch
/// after the error are dropped, so the caller assigns again (at the
/// positions it has) after an error.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_consumer_poll<'a>(
    env: Env<'a>,
    consumer: ResourceArc<Consumer>,
    max: usize,
    block_ms: u64,
    max_record_bytes: usize,
) -> Term<'a> {
    guard::run(env, || {
        let mut guard = lock(&consumer.state);
        let state = guard.as_mut().ok_or_else(NifError::closed)?;
        if let Some(err) = state.pending.take() {
            return Err(err);
        }
        let max = max.clamp(1, MAX_POLL);
        let cap = max_record_bytes.min(MAX_RECORD_CAP);
        let block = config::timeout(block_ms);
        let result = poll(env, state, max, block, cap);
        drain_logs(&state.log_queue, &consumer.logs);
        result
    })
}

/// `:armed`: `pid` gets the message `:larder_source_ready` once when
/// something (a record, an end of partition, an error) is put into the
/// consumer queue, which is empty now; or `:ready`: the queue is not empty
/// (or a poll is under way), read now. One message per call: a reader
/// polls with no wait until a poll comes back short, then calls this.
/// Never waits on a poll (it takes the resource's lock only if free): a
/// normal scheduler.
#[rustler::nif]
fn nif_consumer_notify<'a>(
    env: Env<'a>,
    consumer: ResourceArc<Consumer>,
    pid: LocalPid,
) -> Term<'a> {
    guard::run(env, || {
        let mut guard = match consumer.state.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(atoms::ready().encode(env)),
        };
        let state = guard.as_mut().ok_or_else(NifError::closed)?;
        if state.waker.is_none() {
            let waker = Waker::start()
                .ok_or_else(|| NifError::ours(atoms::config, "cannot start a thread"))?;
            // SAFETY: the queue is live; the opaque points to the waker's
            // shared flags, which live until the waker drops, after the
            // callback is removed (State::drop).
            unsafe {
                rdsys::rd_kafka_queue_cb_event_enable(
                    state.queue.0,
                    Some(wake::on_event),
                    waker.opaque(),
                )
            };
            state.waker = Some(waker);
        }
        let Some(waker) = state.waker.as_ref() else {
            return Ok(atoms::ready().encode(env));
        };
        waker.arm(pid);
        // Armed before looking: an op put in after this look fires the
        // callback; one put in before it is seen here.
        // SAFETY: the queue is live (owned by the state held here).
        if unsafe { rdsys::rd_kafka_queue_length(state.queue.0) } > 0 {
            waker.disarm();
            return Ok(atoms::ready().encode(env));
        }
        Ok(atoms::armed().encode(env))
    })
}

/// Moves librdkafka's log lines from its log queue into `buf`: at most
/// MAX_LOG_LINES kept, the rest counted. The queue is emptied whatever
/// the buffer holds, so it never grows while the consumer is polled.
fn drain_logs(queue: &Queue, buf: &Mutex<LogBuf>) {
    loop {
        // SAFETY: the queue is live (owned by the state the caller holds);
        // each event returned is destroyed once, below.
        let event = unsafe { rdsys::rd_kafka_queue_poll(queue.0, 0) };
        if event.is_null() {
            return;
        }
        let mut fac: *const std::os::raw::c_char = std::ptr::null();
        let mut text: *const std::os::raw::c_char = std::ptr::null();
        let mut level: i32 = 0;
        // SAFETY: `event` is live; rd_kafka_event_log sets the pointers to
        // strings owned by the event (valid until it is destroyed) and
        // returns 0 only for a log event.
        let is_log = unsafe {
            rdsys::rd_kafka_event_type(event) == rdsys::RD_KAFKA_EVENT_LOG
                && rdsys::rd_kafka_event_log(event, &mut fac, &mut text, &mut level) == 0
        };
        if is_log {
            // SAFETY: as above, the strings live until the event is
            // destroyed; a null one is read as empty.
            let (fac, text) = unsafe { (c_text(fac), c_text(text)) };
            let mut buf = lock(buf);
            if fac == "FAIL" {
                buf.failure = Some(without_thread(&text).to_string());
            }
            if buf.lines.len() < MAX_LOG_LINES {
                buf.lines.push((level, fac, text));
            } else {
                buf.dropped += 1;
            }
        }
        // SAFETY: `event` came from rd_kafka_queue_poll and is destroyed
        // once, here.
        unsafe { rdsys::rd_kafka_event_destroy(event) }
    }
}

/// A log line without librdkafka's thread prefix: "[thrd:ssl://h:9092/
/// bootstrap]: ssl://h:9092/bootstrap: SSL handshake failed: ..." ->
/// "ssl://h:9092/bootstrap: SSL handshake failed: ...".
fn without_thread(text: &str) -> &str {
    match text
        .strip_prefix("[thrd:")
        .and_then(|rest| rest.split_once("]: "))
    {
        Some((_thread, rest)) => rest,
        None => text,
    }
}

/// `{:ok, text | nil}`: librdkafka's last broker connection failure since
/// the last metadata or watermark request that succeeded (taken from its
/// log by the calls), which names the cause that a request's error leaves
/// out ("SSL handshake failed: ... connecting to a PLAINTEXT broker
/// listener?", "Connection refused"). Takes only the log buffer's lock: a
/// normal scheduler.
#[rustler::nif]
fn nif_consumer_failure<'a>(env: Env<'a>, consumer: ResourceArc<Consumer>) -> Term<'a> {
    guard::run(env, || {
        let failure = lock(&consumer.logs).failure.clone();
        Ok((atoms::ok(), failure).encode(env))
    })
}

/// A C string as UTF-8 text (lossy), cut to MAX_LOG_TEXT bytes.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string that outlives the call.
unsafe fn c_text(ptr: *const std::os::raw::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    let mut text = CStr::from_ptr(ptr).to_string_lossy().trim().to_string();
    if text.len() > MAX_LOG_TEXT {
        let mut end = MAX_LOG_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `{:ok, [{level, facility, message}], dropped}`: librdkafka's log lines
/// since the last call (syslog levels, 0 emergency .. 7 debug), at most
/// MAX_LOG_LINES, and how many more were dropped. Takes only the log
/// buffer's lock, held for a copy: a normal scheduler.
#[rustler::nif]
fn nif_consumer_logs<'a>(env: Env<'a>, consumer: ResourceArc<Consumer>) -> Term<'a> {
    guard::run(env, || {
        let taken = std::mem::take(&mut *lock(&consumer.logs));
        Ok((atoms::ok(), taken.lines, taken.dropped).encode(env))
    })
}

/// The terms every record of a poll shares, made once per poll.
struct Shared<'a> {
    /// The record's tag, `:kafka_record`.
    tag: Term<'a>,
    nil: Term<'a>,
    /// `[]`, the headers of a record without any.
    no_headers: Term<'a>,
}

impl<'a> Shared<'a> {
    fn new(env: Env<'a>) -> Self {
        Shared {
            tag: atoms::kafka_record().encode(env),
            nil: atoms::nil().encode(env),
            no_headers: Term::list_new_empty(env),
        }
    }
}

/// Messages taken from librdkafka, destroyed when dropped.
struct Taken(Vec<*mut rdsys::rd_kafka_message_t>);

impl Drop for Taken {
    fn drop(&mut self) {
        for &m in &self.0 {
            // SAFETY: each pointer came from rd_kafka_consume_batch_queue,
            // is not null, and is destroyed once, here.
            unsafe { rdsys::rd_kafka_message_destroy(m) }
        }
    }
}

/// Takes up to `max` messages from the consumer queue, waiting up to
/// `wait_ms` for them.
///
/// librdkafka's batch call hands back as a message every op it does not
/// serve itself, and aborts on one that is not a record or an error: an
/// admin result or an offset-commit reply must never reach the consumer
/// queue. So this client never commits (auto commit is off and there is
/// no commit call) and its one admin request (`topic_id`) has a queue of
/// its own.
fn take(queue: &Queue, max: usize, wait_ms: i32) -> Taken {
    let mut taken = Taken(Vec::with_capacity(max));
    // SAFETY: the queue is live (owned by the state the caller holds under
    // the resource's mutex) and the array has room for `max` pointers;
    // librdkafka writes `n <= max` of them and the length is set to that.
    unsafe {
        let n = rdsys::rd_kafka_consume_batch_queue(queue.0, wait_ms, taken.0.as_mut_ptr(), max);
        if n > 0 {
            taken.0.set_len((n as usize).min(max));
        }
    }
    taken
}

fn poll<'a>(
    env: Env<'a>,
    state: &mut State,
    max: usize,
    block: Duration,
    cap: usize,
) -> Result<Term<'a>, NifError> {
    let shared = Shared::new(env);
    let deadline = Instant::now() + block;
    let mut entries: Vec<Term<'a>> = Vec::with_capacity(max.min(4096));
    let mut oversize: Vec<(i32, i64, usize)> = Vec::new();
    let mut error = None;
    // librdkafka's batch call waits until it has all `max` or the time is
    // up: so one message is waited for (up to `block`), and the rest are
    // taken as queued now. An end-of-partition event is a message too, so
    // the wait goes on after one until a record comes or the time is up.
    loop {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(600_000) as i32;
        let first = take(&state.queue, 1, wait);
        let timed_out = first.0.is_empty();
        let rest = if timed_out || max == 1 {
            Taken(Vec::new())
        } else {
            take(&state.queue, max - 1, 0)
        };
        for &m in first.0.iter().chain(rest.0.iter()) {
            // SAFETY: `m` is a live message until `first` and `rest` drop.
            let outcome =
                unsafe { message(env, state, m, &shared, cap, &mut entries, &mut oversize) };
            if let Err(err) = outcome {
                // The records before the error are returned and the error
                // comes with the next poll.
                error = Some(err);
                break;
            }
        }
        let got = !entries.is_empty() || !oversize.is_empty();
        if timed_out || error.is_some() || got || Instant::now() >= deadline {
            break;
        }
    }
    if let Some(err) = error {
        if entries.is_empty() && oversize.is_empty() {
            return Err(err);
        }
        state.pending = Some(err);
    }
    let positions: Vec<(i32, i64)> = state.positions.iter().map(|(&p, &o)| (p, o)).collect();
    Ok((atoms::ok(), entries, positions, oversize).encode(env))
}

/// One message of a batch: a record, an end of partition, or an error.
///
/// # Safety
/// `m` must be a live message.
#[allow(clippy::too_many_arguments)]
unsafe fn message<'a>(
    env: Env<'a>,
    state: &mut State,
    m: *mut rdsys::rd_kafka_message_t,
    shared: &Shared<'a>,
    cap: usize,
    entries: &mut Vec<Term<'a>>,
    oversize: &mut Vec<(i32, i64, usize)>,
) -> Result<(), NifError> {
    let msg = &*m;
    match msg.err {
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => {
            record(env, state, m, shared, cap, entries, oversize);
            Ok(())
        }
        RDKafkaRespErr::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
            // The offset is the fetch position at the partition's end,
            // after everything of it queued before this event.
            if msg.offset >= 0 && msg.partition >= 0 {
                let at = state.positions.entry(msg.partition).or_insert(msg.offset);
                *at = (*at).max(msg.offset);
            }
            Ok(())
        }
        err => {
            // An error without a partition is client-wide and transient (a
            // broker down): librdkafka retries by itself, so it is not
            // returned; an error of a partition is.
            if msg.rkt.is_null() || msg.partition < 0 {
                return Ok(());
            }
            let text = rdsys::rd_kafka_message_errstr(m);
            let text = if text.is_null() {
                String::new()
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            };
            // With auto.offset.reset=error, librdkafka reports a fetch
            // offset the partition no longer (or does not yet) hold as
            // _AUTO_OFFSET_RESET: that is OFFSET_OUT_OF_RANGE to us.
            let err = if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE
            } else {
                err
            };
            Err(NifError::resp(err, Some(msg.partition), text))
        }
    }
}

/// Copies one record into `{{partition, offset}, {:kafka_record, key,
/// value, headers, timestamp, partition, offset}}`: tuples and binaries
/// only (a key or value of up to 64 bytes is a heap binary, made in the
/// reading process's heap; a larger one a binary of its own, never a part
/// of a larger one that it would keep alive).
///
/// # Safety
/// `message` must be a live message of a live event.
unsafe fn record<'a>(
    env: Env<'a>,
    state: &mut State,
    message: *const rdsys::rd_kafka_message_t,
    shared: &Shared<'a>,
    cap: usize,
    entries: &mut Vec<Term<'a>>,
    oversize: &mut Vec<(i32, i64, usize)>,
) {
    let m = &*message;
    let (partition, offset) = (m.partition, m.offset);
    let key = bytes(m.key as *const c_void, m.key_len);
    let value = bytes(m.payload as *const c_void, m.len);
    let mut headers: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
    let mut hdrs: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
    if rdsys::rd_kafka_message_headers(message, &mut hdrs)
        == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        && !hdrs.is_null()
    {
        let count = rdsys::rd_kafka_header_cnt(hdrs);
        for idx in 0..count {
            let mut name: *const std::os::raw::c_char = std::ptr::null();
            let mut val: *const c_void = std::ptr::null();
            let mut size: usize = 0;
            if rdsys::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut val, &mut size)
                != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
                || name.is_null()
            {
                continue;
            }
            let name = CStr::from_ptr(name).to_bytes();
            headers.push((name, bytes(val, size)));
        }
    }
    let size = key.map_or(0, <[u8]>::len)
        + value.map_or(0, <[u8]>::len)
        + headers
            .iter()
            .map(|(n, v)| n.len() + v.map_or(0, <[u8]>::len))
            .sum::<usize>();
    let at = state.positions.entry(partition).or_insert(offset + 1);
    *at = (*at).max(offset + 1);
    if size > cap {
        oversize.push((partition, offset, size));
        return;
    }
    let nil = shared.nil;
    let mut tstype = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    let ts = rdsys::rd_kafka_message_timestamp(message, &mut tstype);
    let ts_term = if ts >= 0
        && tstype != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
    {
        ts.encode(env)
    } else {
        nil
    };
    let headers_term = if headers.is_empty() {
        shared.no_headers
    } else {
        let terms: Vec<Term<'a>> = headers
            .iter()
            .map(|(n, v)| make_tuple(env, &[binary(env, n), opt_binary(env, *v, nil)]))
            .collect();
        terms.encode(env)
    };
    let (partition_term, offset_term) = (partition.encode(env), offset.encode(env));
    let fields = make_tuple(
        env,
        &[
            shared.tag,
            opt_binary(env, key, nil),
            opt_binary(env, value, nil),
            headers_term,
            ts_term,
            partition_term,
            offset_term,
        ],
    );
    let id = make_tuple(env, &[partition_term, offset_term]);
    entries.push(make_tuple(env, &[id, fields]));
}

/// The bytes at `ptr`, or None for a null pointer (a null key or value).
///
/// # Safety
/// `ptr` must be null or point to `len` readable bytes that outlive the use.
unsafe fn bytes<'b>(ptr: *const c_void, len: usize) -> Option<&'b [u8]> {
    if ptr.is_null() {
        None
    } else {
        Some(std::slice::from_raw_parts(ptr as *const u8, len))
    }
}

fn binary<'a>(env: Env<'a>, bytes: &[u8]) -> Term<'a> {
    let mut b = NewBinary::new(env, bytes.len());
    b.as_mut_slice().copy_from_slice(bytes);
    let b: Binary = b.into();
    b.to_term(env)
}

fn opt_binary<'a>(env: Env<'a>, bytes: Option<&[u8]>, nil: Term<'a>) -> Term<'a> {
    match bytes {
        Some(b) => binary(env, b),
        None => nil,
    }
}

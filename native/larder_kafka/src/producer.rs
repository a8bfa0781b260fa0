//! The producer resource, for tests, benchmarks and the demo: records go
//! out with `nif_produce/6` or `nif_produce_batch/3` and
//! `nif_producer_flush/2` waits for them and returns the `{partition,
//! offset}` of each acknowledged since the last flush.

use crate::atoms;
use crate::config;
use crate::error::NifError;
use crate::guard::{self, lock};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};
use rdkafka::ClientContext;
use rustler::{Binary, Encoder, Env, ResourceArc, Term};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most records one batch call takes.
const MAX_BATCH: usize = 100_000;
/// The most acknowledgements kept between two flushes.
const MAX_ACKS: usize = 10_000_000;

#[derive(Default)]
pub struct Acks {
    acked: Mutex<Vec<(i32, i64)>>,
    failed: Mutex<Option<(RDKafkaErrorCode, String, usize)>>,
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
    producer: Mutex<Option<BaseProducer<Acks>>>,
}

#[rustler::resource_impl]
impl rustler::Resource for Producer {}

impl Drop for Producer {
    fn drop(&mut self) {
        if let Some(producer) = lock(&self.producer).take() {
            guard::drop_off_scheduler(producer);
        }
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_producer_open<'a>(env: Env<'a>, config: Term<'a>) -> Term<'a> {
    guard::run(env, || {
        let config = config::decode(config, &[("linger.ms", "5")], &[])?;
        let producer: BaseProducer<Acks> = config.create_with_context(Acks::default())?;
        let resource = ResourceArc::new(Producer {
            producer: Mutex::new(Some(producer)),
        });
        guard::ok(env, resource)
    })
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_producer_close<'a>(env: Env<'a>, producer: ResourceArc<Producer>) -> Term<'a> {
    guard::run(env, || {
        if let Some(producer) = lock(&producer.producer).take() {
            guard::drop_off_scheduler(producer);
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
        let p = guard.as_ref().ok_or_else(NifError::closed)?;
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
        let p = guard.as_ref().ok_or_else(NifError::closed)?;
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
/// flush, or the first delivery error.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_producer_flush<'a>(
    env: Env<'a>,
    producer: ResourceArc<Producer>,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let guard = lock(&producer.producer);
        let p = guard.as_ref().ok_or_else(NifError::closed)?;
        let flushed = p.flush(config::timeout(timeout_ms));
        let acks = std::mem::take(&mut *lock(&p.context().acked));
        if let Some((code, message, n)) = lock(&p.context().failed).take() {
            return Err(NifError::code(
                code,
                format!("{n} record(s) not delivered: {message}"),
            ));
        }
        flushed?;
        guard::ok(env, acks)
    })
}

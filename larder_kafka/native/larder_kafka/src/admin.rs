//! The admin resource, for tests, benchmarks and the demo: create and
//! delete topics, add partitions, delete records before an offset.
//! rdkafka's admin calls return futures; each is waited for here, on the
//! dirty I/O scheduler that runs the call, bounded by the request timeout.

use crate::atoms;
use crate::config;
use crate::error::NifError;
use crate::guard::{self, lock};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rustler::{Binary, Encoder, Env, ResourceArc, Term};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

pub struct Admin {
    client: Mutex<Option<AdminClient<DefaultClientContext>>>,
}

#[rustler::resource_impl]
impl rustler::Resource for Admin {}

impl Drop for Admin {
    fn drop(&mut self) {
        // Dropping joins rdkafka's polling thread (up to 100 ms).
        if let Some(client) = lock(&self.client).take() {
            guard::drop_off_scheduler(client);
        }
    }
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to its end on this thread. rdkafka's admin futures end
/// when librdkafka answers, which it does within the request timeout set
/// on every call here; `limit` bounds the wait should it not.
fn block_on<F: Future>(future: F, limit: Duration) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left.min(Duration::from_millis(50)));
    }
}

fn options(timeout: Duration) -> AdminOptions {
    AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout))
}

fn wait<T>(
    future: impl Future<Output = rdkafka::error::KafkaResult<T>>,
    timeout: Duration,
) -> Result<T, NifError> {
    match block_on(future, timeout + Duration::from_secs(5)) {
        Some(result) => Ok(result?),
        None => Err(NifError::ours(
            atoms::timed_out,
            "the admin call did not end in time",
        )),
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_admin_open<'a>(env: Env<'a>, config: Term<'a>) -> Term<'a> {
    guard::run(env, || {
        let config = config::decode(config, &[], &[])?;
        let client: AdminClient<DefaultClientContext> = config.create()?;
        guard::ok(
            env,
            ResourceArc::new(Admin {
                client: Mutex::new(Some(client)),
            }),
        )
    })
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_admin_close<'a>(env: Env<'a>, admin: ResourceArc<Admin>) -> Term<'a> {
    guard::run(env, || {
        if let Some(client) = lock(&admin.client).take() {
            guard::drop_off_scheduler(client);
        }
        Ok(atoms::ok().encode(env))
    })
}

fn topic_result(result: Vec<rdkafka::admin::TopicResult>) -> Result<(), NifError> {
    for r in result {
        if let Err((topic, code)) = r {
            return Err(NifError::code(code, format!("{topic}: {code}")));
        }
    }
    Ok(())
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_create_topic<'a>(
    env: Env<'a>,
    admin: ResourceArc<Admin>,
    topic: Binary<'a>,
    partitions: i32,
    configs: Vec<(Binary<'a>, Binary<'a>)>,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        if !(1..=10_000).contains(&partitions) || configs.len() > 256 {
            return Err(NifError::bad_arg(
                "partitions 1..10000, at most 256 configs",
            ));
        }
        let mut pairs = Vec::with_capacity(configs.len());
        for (k, v) in &configs {
            let k = std::str::from_utf8(k.as_slice()).map_err(|_| NifError::bad_arg("config"))?;
            let v = std::str::from_utf8(v.as_slice()).map_err(|_| NifError::bad_arg("config"))?;
            pairs.push((k, v));
        }
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for (k, v) in pairs {
            new = new.set(k, v);
        }
        let guard = lock(&admin.client);
        let client = guard.as_ref().ok_or_else(NifError::closed)?;
        let timeout = config::timeout(timeout_ms);
        topic_result(wait(
            client.create_topics([&new], &options(timeout)),
            timeout,
        )?)?;
        Ok(atoms::ok().encode(env))
    })
}

#[rustler::nif(schedule = "DirtyIo")]
fn nif_delete_topic<'a>(
    env: Env<'a>,
    admin: ResourceArc<Admin>,
    topic: Binary<'a>,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        let guard = lock(&admin.client);
        let client = guard.as_ref().ok_or_else(NifError::closed)?;
        let timeout = config::timeout(timeout_ms);
        topic_result(wait(
            client.delete_topics(&[topic], &options(timeout)),
            timeout,
        )?)?;
        Ok(atoms::ok().encode(env))
    })
}

/// Grows `topic` to `count` partitions.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_create_partitions<'a>(
    env: Env<'a>,
    admin: ResourceArc<Admin>,
    topic: Binary<'a>,
    count: usize,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        if !(1..=10_000).contains(&count) {
            return Err(NifError::bad_arg("count 1..10000"));
        }
        let guard = lock(&admin.client);
        let client = guard.as_ref().ok_or_else(NifError::closed)?;
        let timeout = config::timeout(timeout_ms);
        let new = NewPartitions::new(topic, count);
        topic_result(wait(
            client.create_partitions([&new], &options(timeout)),
            timeout,
        )?)?;
        Ok(atoms::ok().encode(env))
    })
}

/// Deletes the records of `topic` before the given offsets:
/// `{:ok, [{partition, new_low_watermark}]}`.
#[rustler::nif(schedule = "DirtyIo")]
fn nif_delete_records<'a>(
    env: Env<'a>,
    admin: ResourceArc<Admin>,
    topic: Binary<'a>,
    offsets: Vec<(i32, i64)>,
    timeout_ms: u64,
) -> Term<'a> {
    guard::run(env, || {
        let topic = config::topic(topic.as_slice())?;
        if offsets.len() > 10_000 {
            return Err(NifError::bad_arg("at most 10000 partitions"));
        }
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in &offsets {
            if p < 0 || o < 0 {
                return Err(NifError::bad_arg("a partition or an offset below 0"));
            }
            tpl.add_partition_offset(topic, p, Offset::Offset(o))?;
        }
        let guard = lock(&admin.client);
        let client = guard.as_ref().ok_or_else(NifError::closed)?;
        let timeout = config::timeout(timeout_ms);
        let result = wait(client.delete_records(&tpl, &options(timeout)), timeout)?;
        let mut lows = Vec::new();
        for e in result.elements() {
            if let Err(err) = e.error() {
                return Err(err.into());
            }
            if let Offset::Offset(o) = e.offset() {
                lows.push((e.partition(), o));
            }
        }
        guard::ok(env, lows)
    })
}

//! Larder's Kafka NIF: a librdkafka consumer (`consumer.rs`) behind
//! `Larder.Replica.Kafka`, and a producer (`producer.rs`) and an admin
//! client (`admin.rs`) for tests, benchmarks and the demo. It is a library
//! of its own, loaded by `Larder.Kafka.Native.load!/0` the first time a
//! Kafka source is used, so a VM that never reads Kafka never maps
//! librdkafka. Every function registered here runs its body under
//! `guard::run` (no panic reaches the VM) and every call that can wait on
//! the network runs on a dirty I/O scheduler.

mod admin;
mod atoms;
mod config;
mod consumer;
mod error;
mod guard;
mod producer;
mod wake;

rustler::init!("Elixir.Larder.Kafka.Native");

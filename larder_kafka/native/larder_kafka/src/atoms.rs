//! Atoms shared by the NIF functions.

rustler::atoms! {
    ok,
    error,
    nil,
    config,
    closed,
    panic,
    bad_arg,
    kafka,
    timed_out,
    unknown_topic,
    partitions,
    topic_id,
    ready,
    armed,
    init,
    begin,
    commit,
    abort,
    kafka_record,
}

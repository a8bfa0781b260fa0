/*
 * librdkafka alone: drains a topic as Larder.Replica.Kafka reads it, for
 * bench/replica_kafka_bench.exs's anchor. Compiled by the bench
 * (Larder.Bench.Anchors) against the librdkafka that the NIF crate's
 * rdkafka-sys build produced (its static library and header under
 * native/larder_kafka/target), so it runs the very librdkafka the NIF
 * links; never committed as a binary.
 *
 *   librdkafka_drain BOOTSTRAP TOPIC [KEY=VALUE ...]
 *
 * KEY=VALUE are librdkafka settings (the replica's, as the bench passes
 * them). Like the NIF's consumer (native/larder_kafka/src/consumer.rs): the
 * settings it forces, a group id but no group joined, every partition
 * assigned from its start, and the consumer queue read 1,000 messages at a
 * time as its poll reads it: one message waited for (up to 100 ms), then
 * what is queued at that moment, up to 999 more, without waiting
 * (rd_kafka_consume_batch_queue() itself waits until it has all it asked
 * for or the time is up: 100 ms lost each time a partition's queue runs
 * short, and at the end). Until every partition reached the high watermark
 * it had before the assignment. Each record's key and value bytes are read
 * (summed), so nothing is left untouched.
 *
 * Prints one line: "records=N bytes=B wall_us=W cpu_us=C": the time from
 * the consumer's creation to the last record (its metadata and watermark
 * requests included, as the NIF loop's and the replica's times include
 * theirs; the close excluded), and the process's CPU time (user + system,
 * every librdkafka thread) over the same span. Exits 1 with a message on
 * stderr on any error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <sys/resource.h>

#include "rdkafka.h"

#define BATCH 1000
#define WAIT_MS 100
#define TIMEOUT_MS 30000

static void die(const char *what, const char *why) {
        fprintf(stderr, "librdkafka_drain: %s: %s\n", what, why);
        exit(1);
}

static int64_t now_us(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t cpu_us(void) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 +
               ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
}

static void set(rd_kafka_conf_t *conf, const char *key, const char *value) {
        char err[512];
        if (rd_kafka_conf_set(conf, key, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
                die(key, err);
}

int main(int argc, char **argv) {
        char err[512];
        if (argc < 3) die("usage", "librdkafka_drain BOOTSTRAP TOPIC [KEY=VALUE ...]");
        const char *topic = argv[2];

        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        set(conf, "bootstrap.servers", argv[1]);
        set(conf, "group.id", "larder");
        for (int i = 3; i < argc; i++) {
                char *eq = strchr(argv[i], '=');
                if (!eq) die("setting without '='", argv[i]);
                *eq = '\0';
                set(conf, argv[i], eq + 1);
        }
        /* What the NIF's consumer forces. */
        set(conf, "enable.auto.commit", "false");
        set(conf, "enable.auto.offset.store", "false");
        set(conf, "enable.partition.eof", "true");
        set(conf, "auto.offset.reset", "error");

        int64_t t0 = now_us(), c0 = cpu_us();
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
        if (!rk) die("rd_kafka_new", err);

        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
        const struct rd_kafka_metadata *md;
        rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, TIMEOUT_MS);
        if (e) die("metadata", rd_kafka_err2str(e));
        if (md->topic_cnt != 1 || md->topics[0].err)
                die("metadata", "no such topic");
        int n = md->topics[0].partition_cnt;
        if (n <= 0) die("metadata", "the topic has no partitions");
        int32_t *ids = calloc(n, sizeof(int32_t));
        int64_t *ends = calloc(n, sizeof(int64_t));
        int64_t *at = calloc(n, sizeof(int64_t));
        int32_t max_id = 0;
        for (int i = 0; i < n; i++) {
                ids[i] = md->topics[0].partitions[i].id;
                if (ids[i] > max_id) max_id = ids[i];
        }
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(rkt);
        /* partition id -> index */
        int *index = malloc(sizeof(int) * ((size_t)max_id + 1));
        if (!ids || !ends || !at || !index) die("memory", "out of memory");
        for (int i = 0; i <= max_id; i++) index[i] = -1;

        rd_kafka_topic_partition_list_t *tpl = rd_kafka_topic_partition_list_new(n);
        for (int i = 0; i < n; i++) {
                int64_t low, high;
                e = rd_kafka_query_watermark_offsets(rk, topic, ids[i], &low, &high, TIMEOUT_MS);
                if (e) die("watermarks", rd_kafka_err2str(e));
                ends[i] = high;
                at[i] = 0;
                index[ids[i]] = i;
                rd_kafka_topic_partition_list_add(tpl, topic, ids[i])->offset =
                    RD_KAFKA_OFFSET_BEGINNING;
        }

        e = rd_kafka_assign(rk, tpl);
        if (e) die("assign", rd_kafka_err2str(e));
        rd_kafka_topic_partition_list_destroy(tpl);

        rd_kafka_queue_t *q = rd_kafka_queue_get_consumer(rk);
        rd_kafka_message_t *msgs[BATCH];
        uint64_t records = 0, bytes = 0;
        for (;;) {
                int done = 1;
                for (int i = 0; i < n; i++)
                        if (at[i] < ends[i]) done = 0;
                if (done) break;
                /* As the NIF's poll: one message waited for, then what is
                 * queued now, without waiting. */
                ssize_t got = rd_kafka_consume_batch_queue(q, WAIT_MS, msgs, 1);
                if (got < 0) die("consume", rd_kafka_err2str(rd_kafka_last_error()));
                if (got == 1) {
                        ssize_t more = rd_kafka_consume_batch_queue(q, 0, msgs + 1, BATCH - 1);
                        if (more < 0) die("consume", rd_kafka_err2str(rd_kafka_last_error()));
                        got += more;
                }
                for (ssize_t j = 0; j < got; j++) {
                        rd_kafka_message_t *m = msgs[j];
                        int i = (m->partition >= 0 && m->partition <= max_id) ? index[m->partition] : -1;
                        if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
                                records++;
                                const unsigned char *k = m->key, *v = m->payload;
                                for (size_t b = 0; b < m->key_len; b++) bytes += k[b];
                                for (size_t b = 0; b < m->len; b++) bytes += v[b];
                                if (i >= 0 && m->offset + 1 > at[i]) at[i] = m->offset + 1;
                        } else if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                                if (i >= 0 && m->offset > at[i]) at[i] = m->offset;
                        } else if (m->rkt) {
                                die("partition error", rd_kafka_message_errstr(m));
                        }
                        rd_kafka_message_destroy(m);
                }
        }
        int64_t wall = now_us() - t0, cpu = cpu_us() - c0;
        printf("records=%llu bytes=%llu wall_us=%lld cpu_us=%lld\n", (unsigned long long)records,
               (unsigned long long)bytes, (long long)wall, (long long)cpu);
        fflush(stdout);
        rd_kafka_queue_destroy(q);
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        return 0;
}

// Java's KafkaConsumer draining a topic, for bench/replica_kafka_bench.exs's
// anchor. Compiled by the bench (Larder.Bench.Anchors) with javac against
// the kafka-clients jar of the Kafka jars scripts/setup fetched; never
// committed as a class file.
//
//   java -cp CLASSES:LIBS/* KafkaDrain MODE BOOTSTRAP TOPIC [KEY=VALUE ...]
//
// KEY=VALUE are consumer settings (the bench passes the replica's fetch
// settings under their Java names, Larder.Bench.Anchors.java_config/1). As
// the replica reads: no group joined (assign()), every partition from its
// start, polled (max.poll.records at a time) until every partition's
// position reached the end offset it had before the assignment. MODE says
// what each record becomes:
//   drain - nothing kept: the key's and value's bytes are summed;
//   story - a HashMap<Integer, ArrayList<Long>>: the key decoded as a
//           big-endian 32-bit integer, the value as a 64-bit one, the
//           value appended to the key's list (the story's decode);
//   map   - a HashMap<String, byte[]>: the key as UTF-8 text, the value's
//           bytes (a tombstone removes the key); the value is not decoded.
//
// Prints one line: "records=N kept=K wall_us=W cpu_us=C": K is the bytes'
// sum (drain) or the map's size; the time from the consumer's creation to
// the last record (the close excluded); the JVM's CPU time (every thread:
// its compiler and collector too) over the same span. Each run is a fresh
// JVM: the time includes loading the client's classes and the JIT's
// warm-up, as a service's restore at start-up would. Exits 2 on a bad
// argument, 1 with a stack trace on any other error.
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class KafkaDrain {
    private static long cpuNanos() {
        com.sun.management.OperatingSystemMXBean os =
            (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        return os.getProcessCpuTime();
    }

    public static void main(String[] args) {
        if (args.length < 3) {
            System.err.println("usage: KafkaDrain drain|story|map BOOTSTRAP TOPIC [KEY=VALUE ...]");
            System.exit(2);
        }
        String mode = args[0];
        if (!mode.equals("drain") && !mode.equals("story") && !mode.equals("map")) {
            System.err.println("KafkaDrain: unknown mode: " + mode);
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        for (int i = 3; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq < 0) {
                System.err.println("KafkaDrain: a setting without '=': " + args[i]);
                System.exit(2);
            }
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }

        long t0 = System.nanoTime();
        long c0 = cpuNanos();
        long records = 0;
        long bytes = 0;
        HashMap<Integer, ArrayList<Long>> story = new HashMap<>();
        HashMap<String, byte[]> map = new HashMap<>();
        long wall;
        long cpu;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<PartitionInfo> infos = consumer.partitionsFor(args[2], Duration.ofSeconds(30));
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo info : infos) {
                partitions.add(new TopicPartition(info.topic(), info.partition()));
            }
            Map<TopicPartition, Long> ends = consumer.endOffsets(partitions, Duration.ofSeconds(30));
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            while (true) {
                boolean done = true;
                for (TopicPartition tp : partitions) {
                    if (consumer.position(tp, Duration.ofSeconds(30)) < ends.get(tp)) {
                        done = false;
                        break;
                    }
                }
                if (done) {
                    break;
                }
                ConsumerRecords<byte[], byte[]> batch = consumer.poll(Duration.ofMillis(100));
                for (ConsumerRecord<byte[], byte[]> r : batch) {
                    records++;
                    byte[] k = r.key();
                    byte[] v = r.value();
                    switch (mode) {
                        case "story":
                            int key = ByteBuffer.wrap(k).getInt();
                            long value = ByteBuffer.wrap(v).getLong();
                            story.computeIfAbsent(key, x -> new ArrayList<>()).add(value);
                            break;
                        case "map":
                            String text = k == null ? "" : new String(k, StandardCharsets.UTF_8);
                            if (v == null) {
                                map.remove(text);
                            } else {
                                map.put(text, v);
                            }
                            break;
                        default:
                            if (k != null) {
                                for (byte b : k) bytes += b & 0xff;
                            }
                            if (v != null) {
                                for (byte b : v) bytes += b & 0xff;
                            }
                    }
                }
            }
            // Before the consumer's close, which the other anchors do not time either.
            wall = (System.nanoTime() - t0) / 1000;
            cpu = (cpuNanos() - c0) / 1000;
        }
        long kept = mode.equals("story") ? story.size() : mode.equals("map") ? map.size() : bytes;
        System.out.println("records=" + records + " kept=" + kept + " wall_us=" + wall + " cpu_us=" + cpu);
    }
}

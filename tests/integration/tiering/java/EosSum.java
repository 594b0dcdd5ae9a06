// A Kafka Streams application with processing.guarantee=exactly_once_v2, for
// test_tiered_streams_eos.py. It reads Long values from the input topic, re-keys each to
// "g<value % groups>" (a repartition: <app>-rekey-repartition), keeps per key the count and
// the sum of its values in a persistent store (RocksDB, changelog <app>-totals-changelog)
// and writes every update, "<count>,<sum>", to the output topic. The store's cache is off,
// so each input record makes exactly one update: the output of a key is its counts 1..n,
// each once, and the increments of its sums are its input values.
//
// Compiled at test time against Kafka's jars and the kafka-streams jar; run as
//   java -cp <classes>:<kafka-streams jars>:<kafka libs>/* EosSum <bootstrap> <application.id>
//        <input> <output> <state dir> <client.id> <groups>
// It prints "state <NEW> <OLD>" on each state change, "replaced <exception>" when a
// stream thread dies and is replaced, and "restored <store> <topic-partition> <start>
// <end> <records>" when a store's restore from its changelog ends (its offsets' first and
// end as the restore began: test_tiered_streams_changelog.py), one line each on stdout;
// it runs until killed (the test kills it with SIGKILL, or SIGTERM to close it).

import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

public class EosSum {
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], appId = args[1], input = args[2], output = args[3];
        String stateDir = args[4], clientId = args[5];
        long groups = Long.parseLong(args[6]);

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.CLIENT_ID_CONFIG, clientId);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 3);
        // Static membership: a restarted instance takes its threads' places in the group at
        // once instead of waiting for the killed one's session to time out.
        props.put(StreamsConfig.mainConsumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG), appId);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1000);
        // A transaction a killed proxy left open is aborted by the coordinator this soon
        props.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 10000);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG), 60000);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 5);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.Long()))
            .selectKey((key, value) -> "g" + (value % groups))
            .groupByKey(Grouped.with("rekey", Serdes.String(), Serdes.Long()))
            .aggregate(
                () -> "0,0",
                (key, value, total) -> {
                    String[] parts = total.split(",");
                    long count = Long.parseLong(parts[0]) + 1;
                    long sum = Long.parseLong(parts[1]) + value;
                    return count + "," + sum;
                },
                Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("totals")
                    .withKeySerde(Serdes.String())
                    .withValueSerde(Serdes.String()))
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setStateListener((now, before) -> say("state " + now + " " + before));
        streams.setUncaughtExceptionHandler(error -> {
            say("replaced " + error.toString().replace('\n', ' '));
            return StreamThreadExceptionResponse.REPLACE_THREAD;
        });
        Map<TopicPartition, String> restoring = new ConcurrentHashMap<>();
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition partition, String store, long start, long end) {
                restoring.put(partition, start + " " + end);
            }

            @Override
            public void onBatchRestored(TopicPartition partition, String store, long end, long count) {}

            @Override
            public void onRestoreEnd(TopicPartition partition, String store, long total) {
                say("restored " + store + " " + partition + " " + restoring.remove(partition) + " " + total);
            }
        });
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(java.time.Duration.ofSeconds(20));
            closed.countDown();
        }));
        streams.start();
        closed.await();
    }
}

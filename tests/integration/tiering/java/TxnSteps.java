// A transactional Java producer (Kafka's own client) through the proxy, for
// test_tiered_transactions.py (via txn_clients.py). One JSON line per step on stdout:
// {"step": name, "error": null or the exception's class name}. Run as a single source
// file: java -cp 'libs/*' TxnSteps.java <mode> <bootstrap> <transactional.id> <topic> [plan]
//
// plan: transactions one after another with one producer, e.g. "commit:5,abort:3"
//   (values <transactional.id>-<transaction>-<record>), each flushed, then ended.
// fence: the first producer sends a record in a transaction; a second producer with the
//   same transactional.id initializes (fencing the first), the first sends again and
//   commits (both must fail as Kafka fails them), the second commits a record of its own.
// rpw: read-process-write, see readProcessWrite below.

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnSteps {
    static void event(String step, Throwable error) {
        String text = error == null ? "null" : "\"" + cause(error).getClass().getSimpleName() + "\"";
        System.out.println("{\"step\": \"" + step + "\", \"error\": " + text + "}");
        System.out.flush();
    }

    static Throwable cause(Throwable e) {
        while (e instanceof ExecutionException && e.getCause() != null) e = e.getCause();
        return e;
    }

    static KafkaProducer<String, String> producer(String bootstrap, String txnId) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        props.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "20000");
        return new KafkaProducer<>(props, new StringSerializer(), new StringSerializer());
    }

    static Throwable send(KafkaProducer<String, String> p, String topic, String value) {
        try {
            p.send(new ProducerRecord<>(topic, 0, null, value)).get(40, TimeUnit.SECONDS);
            return null;
        } catch (Exception e) {
            return e;
        }
    }

    interface Step { void run() throws Exception; }

    static Throwable attempt(Step step) {
        try {
            step.run();
            return null;
        } catch (Exception e) {
            return e;
        }
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0], bootstrap = args[1], txnId = args[2], topic = args[3];
        if (mode.equals("rpw")) {
            readProcessWrite(bootstrap, txnId, topic, args[4].split(","), args[5],
                             Long.parseLong(args[6]), args[7]);
            return;
        }
        if (mode.equals("plan")) {
            try (KafkaProducer<String, String> p = producer(bootstrap, txnId)) {
                p.initTransactions();
                String[] txns = args[4].split(",");
                for (int t = 0; t < txns.length; t++) {
                    String[] parts = txns[t].split(":");
                    p.beginTransaction();
                    for (int n = 0; n < Integer.parseInt(parts[1]); n++) {
                        p.send(new ProducerRecord<>(topic, 0, null, txnId + "-" + t + "-" + n));
                    }
                    p.flush();
                    event("txn" + t, attempt(() -> {
                        if (parts[0].equals("commit")) p.commitTransaction();
                        else p.abortTransaction();
                    }));
                }
            }
            return;
        }
        KafkaProducer<String, String> first = producer(bootstrap, txnId);
        first.initTransactions();
        first.beginTransaction();
        event("first_send", send(first, topic, txnId + "-first-0"));
        try (KafkaProducer<String, String> second = producer(bootstrap, txnId)) {
            event("second_init", attempt(second::initTransactions));
            event("first_next_send", send(first, topic, txnId + "-first-1"));
            event("first_commit", attempt(first::commitTransaction));
            first.close(java.time.Duration.ZERO);
            event("second_commit", attempt(() -> {
                second.beginTransaction();
                second.send(new ProducerRecord<>(topic, 0, null, txnId + "-second-0")).get(40, TimeUnit.SECONDS);
                second.commitTransaction();
            }));
        }
    }

    static String quoted(String text) {
        return "\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    // rpw <bootstrap> <transactional.id> <input> <output,output> <group> <end> <commit|abort>:
    // a new consumer instance of the group (read_committed, subscribed to partition 0 of
    // the input) reads from the group's committed offset to `end`; if it read anything, one
    // transaction writes "out-<value>" of each record to partition 0 of every output
    // (flushed), sends the group's offsets (sendOffsetsToTransaction with the consumer's
    // group metadata) and ends as told. Prints {"read": [values]} and, when there was a
    // transaction, {"step": "end", "error": ...}.
    static void readProcessWrite(String bootstrap, String txnId, String input, String[] outputs,
                                 String group, long end, String ending) throws Exception {
        Map<String, Object> config = Map.of(
            ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap, ConsumerConfig.GROUP_ID_CONFIG, group,
            ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed",
            ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false",
            ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        TopicPartition tp = new TopicPartition(input, 0);
        List<String> read = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer =
                 new KafkaConsumer<>(config, new StringDeserializer(), new StringDeserializer());
             KafkaProducer<String, String> producer = producer(bootstrap, txnId)) {
            producer.initTransactions();
            consumer.subscribe(List.of(input));
            long deadline = System.currentTimeMillis() + 60000;
            while (!consumer.assignment().contains(tp) || consumer.position(tp) < end) {
                if (System.currentTimeMillis() > deadline)
                    throw new IllegalStateException("read " + read.size() + " of the input");
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200)))
                    read.add(r.value());
            }
            List<String> values = new ArrayList<>();
            for (String value : read) values.add(quoted(value));
            System.out.println("{\"read\": [" + String.join(", ", values) + "]}");
            if (read.isEmpty()) return;
            long position = consumer.position(tp);
            event("end", attempt(() -> {
                producer.beginTransaction();
                for (String value : read)
                    for (String output : outputs)
                        producer.send(new ProducerRecord<>(output, 0, null, "out-" + value));
                producer.flush();  // written, not purged by the abort: as the other clients
                producer.sendOffsetsToTransaction(
                    Map.of(tp, new OffsetAndMetadata(position)), consumer.groupMetadata());
                if (ending.equals("commit")) producer.commitTransaction();
                else producer.abortTransaction();
            }));
        }
    }
}

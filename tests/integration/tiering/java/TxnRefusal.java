// A transactional Java producer (Kafka's own client) meeting a tiered topic through the
// proxy: it sends to the tiered topic and prints what it surfaces, aborts, then commits a
// transaction to a passthrough topic. One JSON line per step on stdout, for
// test_tiered_txn_refusal.py. Run as a single source file: java -cp 'libs/*' TxnRefusal.java
// <bootstrap> <transactional.id> <tiered topic> <passthrough topic>

import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnRefusal {
    static void event(String step, Throwable error) {
        String text = error == null ? "null" : quote(error.getClass().getName() + ": " + error.getMessage());
        System.out.println("{\"step\": \"" + step + "\", \"error\": " + text + "}");
        System.out.flush();
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }

    static Throwable cause(Throwable e) {
        return e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[1]);
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        props.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "20000");
        try (KafkaProducer<String, String> producer =
                new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
            producer.initTransactions();
            producer.beginTransaction();
            try {
                producer.send(new ProducerRecord<>(args[2], 0, null, "to-tiered")).get(40, TimeUnit.SECONDS);
                event("send_tiered", null);
            } catch (Exception e) {
                event("send_tiered", cause(e));
            }
            try {
                producer.commitTransaction();
                event("commit_tiered", null);
            } catch (Exception e) {
                event("commit_tiered", e);
            }
            try {
                producer.abortTransaction();
                event("abort", null);
            } catch (Exception e) {
                event("abort", e);
                return;
            }
            try {
                producer.beginTransaction();
                producer.send(new ProducerRecord<>(args[3], 0, null, "java-committed")).get(40, TimeUnit.SECONDS);
                producer.commitTransaction();
                event("commit_plain", null);
            } catch (Exception e) {
                event("commit_plain", cause(e));
            }
        }
    }
}

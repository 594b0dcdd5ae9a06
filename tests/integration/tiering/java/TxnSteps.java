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

import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
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
}

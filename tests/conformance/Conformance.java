// The Java client's runner for the conformance suite (tests/conformance/clients_java.py).
// Reads one JSON command a line on stdin, runs it with Kafka's own Java client (producer,
// consumer, admin) against every topic it names, and prints one JSON answer a line:
// {"answers": {topic: answer}}. Bytes travel as base64, null as null; errors as Kafka's
// error names (Errors.forException), so the Python side compares them as it does the
// other clients' answers.
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.DeletedRecords;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetOutOfRangeException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Conformance {
  static final ObjectMapper JSON = new ObjectMapper();
  // as ops.DELETE_TIMEOUT_MS: Kafka holds a DeleteRecords until every replica moved its log start
  static final int DELETE_TIMEOUT_MS = 60000;
  static final Map<String, KafkaProducer<byte[], byte[]>> PRODUCERS = new HashMap<>();
  static final Map<String, Admin> ADMINS = new HashMap<>();
  // a scenario's transactional producers, by transactional id, and those in a transaction
  static final Map<String, KafkaProducer<byte[], byte[]>> TXNS = new HashMap<>();
  static final Set<String> OPEN = new HashSet<>();

  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintStream out = new PrintStream(System.out, true, "UTF-8");
    String line;
    while ((line = in.readLine()) != null) {
      ObjectNode answer = JSON.createObjectNode();
      try {
        answer.set("answers", handle(JSON.readTree(line)));
      } catch (Throwable t) {
        StringBuilder chain = new StringBuilder(t.toString());
        for (Throwable c = t.getCause(); c != null; c = c.getCause()) chain.append(" <- ").append(c);
        answer.put("fatal", chain.toString());
      }
      out.println(JSON.writeValueAsString(answer));
    }
    for (KafkaProducer<byte[], byte[]> p : PRODUCERS.values()) p.close(Duration.ofSeconds(5));
    for (Admin a : ADMINS.values()) a.close(Duration.ofSeconds(5));
    closeTransactions();
  }

  static ObjectNode handle(JsonNode cmd) throws Exception {
    String op = cmd.get("op").asText();
    switch (op) {
      case "produce": return produce(cmd);
      case "txn_produce": return txnProduce(cmd);
      case "close_transactions": return closeTransactions();
      case "fetch": return fetch(cmd);
      case "list_offsets": return listOffsets(cmd);
      case "delete_records": return deleteRecords(cmd);
      case "commit": return commit(cmd);
      case "resume": return resume(cmd);
      default: throw new IllegalArgumentException("unknown op " + op);
    }
  }

  static Properties common(JsonNode cmd) {
    Properties props = new Properties();
    props.put("bootstrap.servers", cmd.get("bootstrap").asText());
    props.put("client.id", "conformance-java,tierproxy_az=" + cmd.get("zone").asText());
    return props;
  }

  static List<TopicPartition> partitions(JsonNode cmd) {
    List<TopicPartition> tps = new ArrayList<>();
    for (JsonNode t : cmd.get("topics")) tps.add(new TopicPartition(t.asText(), 0));
    return tps;
  }

  static String error(Throwable t) {
    while (t instanceof ExecutionException && t.getCause() != null) t = t.getCause();
    Errors e = Errors.forException(t);
    // a record refused with its batch for another record's fault: the client's own wording
    return e == Errors.UNKNOWN_SERVER_ERROR ? "UNKNOWN:" + t.getClass().getSimpleName() : e.name();
  }

  static byte[] bytes(JsonNode n) {
    return n == null || n.isNull() ? null : Base64.getDecoder().decode(n.asText());
  }

  static String b64(byte[] b) {
    return b == null ? null : Base64.getEncoder().encodeToString(b);
  }

  static ObjectNode produce(JsonNode cmd) throws Exception {
    String codec = cmd.get("codec").asText();
    String key = cmd.get("bootstrap").asText() + "/" + cmd.get("zone").asText() + "/" + codec;
    KafkaProducer<byte[], byte[]> producer = PRODUCERS.get(key);
    if (producer == null) {
      Properties props = common(cmd);
      props.put("compression.type", codec);
      props.put("acks", "all");
      props.put("enable.idempotence", "true");
      props.put("linger.ms", "1000"); // flush() sends at once: one batch per topic and call
      props.put("batch.size", "1048576");
      props.put("delivery.timeout.ms", "90000");
      props.put("key.serializer", ByteArraySerializer.class.getName());
      props.put("value.serializer", ByteArraySerializer.class.getName());
      producer = new KafkaProducer<>(props);
      PRODUCERS.put(key, producer);
    }
    Map<String, List<Future<RecordMetadata>>> sent = new HashMap<>();
    for (TopicPartition tp : partitions(cmd)) {
      List<Future<RecordMetadata>> futures = new ArrayList<>();
      for (JsonNode r : cmd.get("records")) futures.add(producer.send(producerRecord(tp.topic(), r)));
      sent.put(tp.topic(), futures);
    }
    producer.flush();
    ObjectNode answers = JSON.createObjectNode();
    for (Map.Entry<String, List<Future<RecordMetadata>>> e : sent.entrySet()) {
      ArrayNode offsets = JSON.createArrayNode();
      for (Future<RecordMetadata> f : e.getValue()) {
        try {
          offsets.add(f.get().offset());
        } catch (ExecutionException ex) {
          offsets.add(error(ex));
        }
      }
      answers.set(e.getKey(), offsets);
    }
    return answers;
  }

  static ProducerRecord<byte[], byte[]> producerRecord(String topic, JsonNode r) {
    List<Header> headers = new ArrayList<>();
    for (JsonNode h : r.get("headers")) headers.add(new RecordHeader(h.get(0).asText(), bytes(h.get(1))));
    return new ProducerRecord<>(topic, 0, r.get("ts").asLong(), bytes(r.get("key")),
        bytes(r.get("value")), headers);
  }

  // Records in a transaction of the scenario (one producer per topic and txn, kept across
  // commands), then commit, abort or leave it open: the offsets, then how it ended.
  static ObjectNode txnProduce(JsonNode cmd) {
    ObjectNode answers = JSON.createObjectNode();
    for (TopicPartition tp : partitions(cmd)) {
      String id = tp.topic() + "-txn" + cmd.get("txn").asInt();
      ArrayNode answer = JSON.createArrayNode();
      answers.set(tp.topic(), answer);
      KafkaProducer<byte[], byte[]> producer = TXNS.get(id);
      if (producer == null) {
        Properties props = common(cmd);
        props.put("compression.type", cmd.get("codec").asText());
        props.put("transactional.id", id);
        props.put("transaction.timeout.ms", "60000");
        props.put("linger.ms", "1000");
        props.put("batch.size", "1048576");
        props.put("delivery.timeout.ms", "90000");
        props.put("max.block.ms", "30000");
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        producer = new KafkaProducer<>(props);
        try {
          producer.initTransactions();
        } catch (Exception e) {
          producer.close(Duration.ZERO);
          answer.add(error(e));
          continue;
        }
        TXNS.put(id, producer);
      }
      if (OPEN.add(id)) producer.beginTransaction();
      List<Future<RecordMetadata>> futures = new ArrayList<>();
      for (JsonNode r : cmd.get("records")) futures.add(producer.send(producerRecord(tp.topic(), r)));
      producer.flush();
      for (Future<RecordMetadata> f : futures) {
        try {
          answer.add(f.get().offset());
        } catch (Exception ex) {
          answer.add(error(ex));
        }
      }
      String end = cmd.get("end").asText();
      if (end.equals("open")) {
        answer.add("open");
        continue;
      }
      try {
        if (end.equals("commit")) producer.commitTransaction();
        else producer.abortTransaction();
        answer.add(end);
        OPEN.remove(id);
      } catch (Exception e) {
        answer.add(error(e));
        try {
          producer.abortTransaction();
          OPEN.remove(id);
        } catch (Exception again) { // fatal: a new producer next time
          producer.close(Duration.ZERO);
          TXNS.remove(id);
          OPEN.remove(id);
        }
      }
    }
    return answers;
  }

  static ObjectNode closeTransactions() {
    for (Map.Entry<String, KafkaProducer<byte[], byte[]>> e : TXNS.entrySet()) {
      try {
        if (OPEN.contains(e.getKey())) e.getValue().abortTransaction();
      } catch (Exception ignored) { // the scenario's answers already name what failed
      }
      e.getValue().close(Duration.ofSeconds(5));
    }
    TXNS.clear();
    OPEN.clear();
    return JSON.createObjectNode();
  }

  static KafkaConsumer<byte[], byte[]> consumer(JsonNode cmd, String group, String reset) {
    Properties props = common(cmd);
    if (group != null) props.put("group.id", group);
    JsonNode isolation = cmd.get("isolation");
    if (isolation != null) props.put("isolation.level", isolation.asText());
    props.put("enable.auto.commit", "false");
    props.put("auto.offset.reset", reset);
    props.put("key.deserializer", ByteArrayDeserializer.class.getName());
    props.put("value.deserializer", ByteArrayDeserializer.class.getName());
    return new KafkaConsumer<>(props);
  }

  static ObjectNode record(ConsumerRecord<byte[], byte[]> r) {
    ObjectNode n = JSON.createObjectNode();
    n.put("offset", r.offset());
    n.put("key", b64(r.key()));
    n.put("value", b64(r.value()));
    n.put("ts", r.timestamp());
    n.put("ts_type", r.timestampType().name);
    ArrayNode headers = n.putArray("headers");
    for (Header h : r.headers()) headers.addArray().add(h.key()).add(b64(h.value()));
    return n;
  }

  static ObjectNode fetch(JsonNode cmd) throws Exception {
    long offset = cmd.get("offset").asLong();
    long deadline = System.currentTimeMillis() + cmd.get("timeout_ms").asLong();
    ObjectNode answers = JSON.createObjectNode();
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(cmd, null, "none")) {
      List<TopicPartition> tps = partitions(cmd);
      consumer.assign(tps);
      for (TopicPartition tp : tps) consumer.seek(tp, offset);
      // the end: the high watermark, or with read_committed the last stable offset
      Map<TopicPartition, Long> ends = consumer.endOffsets(tps, Duration.ofSeconds(30));
      Map<TopicPartition, Long> highs = ends;
      if ("read_committed".equals(cmd.path("isolation").asText())) highs = highWatermarks(cmd, tps);
      Map<TopicPartition, ArrayNode> got = new HashMap<>();
      Set<TopicPartition> open = new HashSet<>(tps);
      for (TopicPartition tp : tps) got.put(tp, JSON.createArrayNode());
      while (!open.isEmpty() && System.currentTimeMillis() < deadline) {
        for (TopicPartition tp : new ArrayList<>(open)) {
          // at the end: done; past it, the next fetch answers OFFSET_OUT_OF_RANGE, but
          // past the last stable offset and not the high watermark, no records
          long position = consumer.position(tp);
          if (position == ends.get(tp) || (ends.get(tp) < position && position <= highs.get(tp))) {
            ObjectNode end = JSON.createObjectNode();
            end.put("end", consumer.position(tp));
            got.get(tp).add(end);
            open.remove(tp);
            consumer.pause(List.of(tp));
          }
        }
        if (open.isEmpty()) break;
        try {
          for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
            got.get(new TopicPartition(r.topic(), r.partition())).add(record(r));
          }
        } catch (OffsetOutOfRangeException e) {
          for (TopicPartition tp : e.partitions()) {
            ObjectNode err = JSON.createObjectNode();
            err.put("error", "OFFSET_OUT_OF_RANGE");
            got.get(tp).add(err);
            open.remove(tp);
            consumer.pause(List.of(tp));
          }
        }
      }
      for (TopicPartition tp : open) {
        ObjectNode err = JSON.createObjectNode();
        err.put("error", "TIMEOUT");
        got.get(tp).add(err);
      }
      for (TopicPartition tp : tps) answers.set(tp.topic(), got.get(tp));
    }
    return answers;
  }

  static Map<TopicPartition, Long> highWatermarks(JsonNode cmd, List<TopicPartition> tps)
      throws Exception {
    Map<TopicPartition, OffsetSpec> asked = new HashMap<>();
    for (TopicPartition tp : tps) asked.put(tp, OffsetSpec.latest());
    Map<TopicPartition, Long> highs = new HashMap<>();
    ListOffsetsResult result = admin(cmd).listOffsets(asked);
    for (TopicPartition tp : tps) highs.put(tp, result.partitionResult(tp).get().offset());
    return highs;
  }

  static Admin admin(JsonNode cmd) {
    return admin(cmd, 15000);
  }

  static Admin admin(JsonNode cmd, int timeoutMs) {
    String key = cmd.get("bootstrap").asText() + "/" + cmd.get("zone").asText() + "/" + timeoutMs;
    return ADMINS.computeIfAbsent(key, k -> {
      Properties props = common(cmd);
      props.put("request.timeout.ms", String.valueOf(timeoutMs));
      props.put("default.api.timeout.ms", String.valueOf(timeoutMs));
      return Admin.create(props);
    });
  }

  static OffsetSpec spec(JsonNode cmd) {
    switch (cmd.get("spec").asText()) {
      case "earliest": return OffsetSpec.earliest();
      case "latest": return OffsetSpec.latest();
      case "max_timestamp": return OffsetSpec.maxTimestamp();
      case "earliest_local": return OffsetSpec.earliestLocal();
      case "latest_tiered": return OffsetSpec.latestTiered();
      case "timestamp": return OffsetSpec.forTimestamp(cmd.get("ts").asLong());
      default: throw new IllegalArgumentException("spec " + cmd.get("spec"));
    }
  }

  static ObjectNode listOffsets(JsonNode cmd) {
    Map<TopicPartition, OffsetSpec> asked = new HashMap<>();
    for (TopicPartition tp : partitions(cmd)) asked.put(tp, spec(cmd));
    IsolationLevel isolation = "read_committed".equals(cmd.path("isolation").asText())
        ? IsolationLevel.READ_COMMITTED : IsolationLevel.READ_UNCOMMITTED;
    ListOffsetsResult result = admin(cmd).listOffsets(asked, new ListOffsetsOptions(isolation));
    ObjectNode answers = JSON.createObjectNode();
    for (TopicPartition tp : asked.keySet()) {
      ObjectNode n = JSON.createObjectNode();
      try {
        ListOffsetsResult.ListOffsetsResultInfo info = result.partitionResult(tp).get();
        n.put("offset", info.offset());
        n.put("ts", info.timestamp());
        n.put("leader_epoch", info.leaderEpoch().orElse(-1));
      } catch (Exception e) {
        n.put("error", error(e));
      }
      answers.set(tp.topic(), n);
    }
    return answers;
  }

  static ObjectNode deleteRecords(JsonNode cmd) {
    Map<TopicPartition, RecordsToDelete> asked = new HashMap<>();
    for (TopicPartition tp : partitions(cmd)) {
      asked.put(tp, RecordsToDelete.beforeOffset(cmd.get("offset").asLong()));
    }
    Map<TopicPartition, org.apache.kafka.common.KafkaFuture<DeletedRecords>> result =
        admin(cmd, DELETE_TIMEOUT_MS).deleteRecords(asked).lowWatermarks();
    ObjectNode answers = JSON.createObjectNode();
    for (TopicPartition tp : asked.keySet()) {
      ObjectNode n = JSON.createObjectNode();
      try {
        n.put("low_watermark", result.get(tp).get().lowWatermark());
      } catch (Exception e) {
        n.put("error", error(e));
      }
      answers.set(tp.topic(), n);
    }
    return answers;
  }

  static ObjectNode commit(JsonNode cmd) {
    ObjectNode answers = JSON.createObjectNode();
    for (TopicPartition tp : partitions(cmd)) {
      ObjectNode n = JSON.createObjectNode();
      try (KafkaConsumer<byte[], byte[]> consumer = consumer(cmd, cmd.get("group").asText(), "none")) {
        consumer.assign(List.of(tp));
        consumer.commitSync(Map.of(tp, new OffsetAndMetadata(cmd.get("offset").asLong())));
        OffsetAndMetadata read = consumer.committed(Set.of(tp)).get(tp);
        n.put("committed", read == null ? -1 : read.offset());
      } catch (Exception e) {
        n.put("error", error(e));
      }
      answers.set(tp.topic(), n);
    }
    return answers;
  }

  static ObjectNode resume(JsonNode cmd) {
    ObjectNode answers = JSON.createObjectNode();
    long timeout = cmd.get("timeout_ms").asLong();
    for (TopicPartition tp : partitions(cmd)) {
      ObjectNode n = JSON.createObjectNode();
      String reset = cmd.get("reset").asText();
      try (KafkaConsumer<byte[], byte[]> consumer = consumer(cmd, cmd.get("group").asText(), reset)) {
        consumer.assign(List.of(tp));
        long end = consumer.endOffsets(List.of(tp), Duration.ofSeconds(30)).get(tp);
        long deadline = System.currentTimeMillis() + timeout;
        while (true) {
          var records = consumer.poll(Duration.ofMillis(200));
          if (!records.isEmpty()) {
            ConsumerRecord<byte[], byte[]> first = records.iterator().next();
            n.put("offset", first.offset());
            n.put("value", b64(first.value()));
            break;
          }
          long position = consumer.position(tp);
          if (position >= end) {
            n.put("end", position);
            break;
          }
          if (System.currentTimeMillis() > deadline) {
            n.put("error", "TIMEOUT");
            break;
          }
        }
      } catch (Exception e) {
        n.put("error", error(e));
      }
      answers.set(tp.topic(), n);
    }
    return answers;
  }
}

// A consumer of the dispatcher's tasks, in Java 17, with the RabbitMQ Java
// client (Debian: librabbitmq-client-java) and lz4-java's XXH64 (Debian:
// liblz4-java). It follows CONTRACT.md only.
//
// It declares its queue, binds it to the queue's exchange with its routing
// key, and consumes with manual acks and a prefetch. By default the queue is
// exclusive and auto-delete: it lives as long as this consumer, so it never
// collects messages that no one will read. With --durable it is a durable,
// shared queue that outlives the consumer (several workers, restarts): it
// keeps collecting while no consumer runs, so delete it once done with it
// (rabbitmqctl delete_queue QUEUE). Each task is
// "worked on" (printed), then acked, so a crash in between gets it
// delivered again. Delivery is at least once, so it drops duplicates by
// message_id (and acks them). It checks every message against the contract:
// message_id is the lowercase 16-hex XXH64 of the task's id (header
// x-task-id, for a task scheduled by id) or else of the body, '-', the due
// time in ms, which also comes in header x-due-ms. A task's trace context
// comes in header traceparent (W3C: 00-<trace id>-<span id>-<flags>) if the
// producer gave one.
//
//   javac -cp "$CP" -d /tmp/consumer Consumer.java
//   java -cp "/tmp/consumer:$CP" Consumer amqp://guest:guest@localhost:5672/ tasks default my-worker
//   java -cp "/tmp/consumer:$CP" Consumer --check-vectors
//
// with CP=/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar:
// /usr/share/java/slf4j-simple.jar:/usr/share/java/lz4-java.jar (one line).
//
// Arguments: AMQP_URI EXCHANGE ROUTING_KEY QUEUE, then optionally
// --durable (see above), --expect N (exit once N distinct tasks were done
// and none came for --quiet-ms, default 1000), --timeout SECONDS (give up;
// exit 1) and --prefetch N (default 50). Without --expect it runs until
// SIGINT/SIGTERM.
// It prints "ready ..." once consuming, "delivered <message_id> <body>" per
// task done, after it "task-id <message_id> <id>" for a task with an id and
// "trace-id <message_id> <trace id>" for one with a traceparent (a
// traceparent of another form: "trace-id <message_id> ? <traceparent>"),
// "duplicate <message_id> dropped" per duplicate, "rejected
// <message_id>: <why>" per message that breaks the contract, and last
// "summary: delivered N, duplicates dropped N, rejected N".

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.BuiltinExchangeType;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.LongString;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import net.jpountz.xxhash.XXHash64;
import net.jpountz.xxhash.XXHashFactory;

public final class Consumer {
    private static final XXHash64 XXH64 = XXHashFactory.fastestInstance().hash64();

    /** XXH64 of member with seed 0, as the contract hashes. */
    static long xxh64(byte[] member) {
        return XXH64.hash(member, 0, member.length, 0L);
    }

    /** The shard a producer ZADDs member into: XXH64 mod M, the hash read as unsigned. */
    static int shardOf(byte[] member, int shards) {
        return (int) Long.remainderUnsigned(xxh64(member), shards);
    }

    /** The message_id of member scheduled at dueMs: 16 lowercase hex digits, '-', due ms. */
    static String messageId(byte[] member, long dueMs) {
        return String.format("%016x-%d", xxh64(member), dueMs);
    }

    /** CONTRACT.md's test vectors: member, XXH64 in hex, shard of 16. */
    private static final Object[][] VECTORS = {
        {"", "ef46db3751d8e999", 9},
        {"a", "d24ec4f1a98c6e5b", 11},
        {"order:42", "aa1f6214e0a40ff4", 4},
        {"{\"id\":1}", "b7885ee991dfe823", 3},
        {"задача", "2cc77690f6f15f7a", 10},
    };

    /** Fails loudly if lz4-java's XXH64 disagrees with the contract. */
    static void checkVectors() {
        for (Object[] v : VECTORS) {
            byte[] member = ((String) v[0]).getBytes(StandardCharsets.UTF_8);
            String hex = messageId(member, 0).substring(0, 16);
            int shard = shardOf(member, 16);
            if (!hex.equals(v[1]) || shard != (int) v[2]) {
                throw new IllegalStateException("XXH64 test vector \"" + v[0] + "\": got " + hex + " (shard " + shard
                        + " of 16), the contract says " + v[1] + " (shard " + v[2] + ")");
            }
        }
    }

    /** A header's value as bytes (AMQP long strings), or null if absent or not a string. */
    static byte[] headerBytes(Delivery d, String name) {
        Map<String, Object> headers = d.getProperties().getHeaders();
        Object v = headers == null ? null : headers.get(name);
        if (v instanceof LongString s) {
            return s.getBytes();
        }
        return v instanceof String s ? s.getBytes(StandardCharsets.UTF_8) : null;
    }

    /** The task id (header x-task-id) as text, or null for a task scheduled without one. */
    static String taskId(Delivery d) {
        byte[] id = headerBytes(d, "x-task-id");
        return id == null ? null : new String(id, StandardCharsets.UTF_8);
    }

    private static final java.util.regex.Pattern TRACEPARENT =
            java.util.regex.Pattern.compile("[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}");

    /**
     * The trace id of header traceparent, 00-<trace id>-<span id>-<flags>:
     * its second field; "? <value>" for a traceparent of another form; null
     * without one.
     */
    static String traceId(Delivery d) {
        byte[] tp = headerBytes(d, "traceparent");
        if (tp == null) {
            return null;
        }
        String v = new String(tp, StandardCharsets.UTF_8).trim();
        java.util.regex.Matcher m = TRACEPARENT.matcher(v);
        return m.matches() ? m.group(1) : "? " + v;
    }

    /** Why a message breaks the contract, or null if it keeps it. */
    static String contractViolation(Delivery d) {
        AMQP.BasicProperties p = d.getProperties();
        Map<String, Object> headers = p.getHeaders();
        Object due = headers == null ? null : headers.get("x-due-ms");
        if (p.getMessageId() == null) {
            return "no message_id";
        }
        if (!(due instanceof Number)) {
            return "no integer header x-due-ms";
        }
        // The member hashed: the task's id if it has one, else its body.
        byte[] id = headerBytes(d, "x-task-id");
        String want = messageId(id != null ? id : d.getBody(), ((Number) due).longValue());
        if (!p.getMessageId().equals(want)) {
            return "message_id should be " + want;
        }
        if (p.getDeliveryMode() == null || p.getDeliveryMode() != 2) {
            return "not persistent";
        }
        return null;
    }

    // The message_ids already done. A real consumer keeps them where they
    // outlive a restart (e.g. a table with a unique key, written in the same
    // transaction as the work) and forgets them after a while.
    private final Set<String> done = ConcurrentHashMap.newKeySet();
    private final AtomicLong duplicates = new AtomicLong();
    private final AtomicLong rejected = new AtomicLong();
    private volatile long lastDeliveryNanos = System.nanoTime();

    /** The work: here, printing the task, its id and its trace id. */
    private void work(String messageId, Delivery d) {
        StringBuilder out = new StringBuilder("delivered " + messageId + " " + new String(d.getBody(), StandardCharsets.UTF_8));
        String id = taskId(d), trace = traceId(d);
        if (id != null) {
            out.append("\ntask-id ").append(messageId).append(' ').append(id);
        }
        if (trace != null) {
            // A real consumer continues the producer's trace here (its span's parent).
            out.append("\ntrace-id ").append(messageId).append(' ').append(trace);
        }
        System.out.println(out); // one call: the lines of one task stay together
    }

    /** Called for each delivery, one at a time per channel. */
    private void handle(Channel ch, Delivery d) throws IOException {
        lastDeliveryNanos = System.nanoTime();
        long tag = d.getEnvelope().getDeliveryTag();
        String id = d.getProperties().getMessageId();
        if (id != null && done.contains(id)) {
            duplicates.incrementAndGet();
            System.out.println("duplicate " + id + " dropped");
            ch.basicAck(tag, false); // done before: acked, not worked on again
            return;
        }
        String why = contractViolation(d);
        if (why != null) {
            rejected.incrementAndGet();
            System.out.println("rejected " + id + ": " + why);
            ch.basicReject(tag, false); // to the queue's dead-letter exchange, if it has one
            return;
        }
        work(id, d);
        done.add(id); // only once the work is done
        ch.basicAck(tag, false); // after the work: a crash before this gets it redelivered
    }

    public static void main(String[] args) throws Exception {
        try {
            checkVectors();
        } catch (IllegalStateException e) {
            System.err.println("Consumer: " + e.getMessage() + ": lz4-java does not compute the contract's XXH64");
            System.exit(2);
        }
        if (args.length == 1 && args[0].equals("--check-vectors")) {
            System.out.println("XXH64 test vectors: " + VECTORS.length + " ok");
            return;
        }
        String usage = "usage: Consumer AMQP_URI EXCHANGE ROUTING_KEY QUEUE [--durable] [--expect N] [--quiet-ms MS]"
                + " [--timeout SECONDS] [--prefetch N] | --check-vectors";
        if (args.length < 4) {
            System.err.println(usage);
            System.exit(2);
        }
        String uri = args[0], exchange = args[1], routingKey = args[2], queue = args[3];
        long expect = 0, quietMs = 1000, timeoutS = 0;
        int prefetch = 50;
        boolean durable = false;
        for (int i = 4; i < args.length; i++) {
            if (args[i].equals("--durable")) {
                durable = true;
                continue;
            }
            if (i + 1 >= args.length) {
                System.err.println("Consumer: option " + args[i] + " needs a value; " + usage);
                System.exit(2);
            }
            switch (args[i]) {
                case "--expect" -> expect = Long.parseLong(args[++i]);
                case "--quiet-ms" -> quietMs = Long.parseLong(args[++i]);
                case "--timeout" -> timeoutS = Long.parseLong(args[++i]);
                case "--prefetch" -> prefetch = Integer.parseInt(args[++i]);
                default -> {
                    System.err.println("Consumer: unknown option " + args[i]);
                    System.exit(2);
                }
            }
        }

        Consumer c = new Consumer();
        CountDownLatch stop = new CountDownLatch(1);
        CountDownLatch stopped = new CountDownLatch(1);
        AtomicLong signalled = new AtomicLong();
        AtomicLong cancelled = new AtomicLong();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            signalled.set(1); // SIGINT, SIGTERM: stop consuming, print the summary
            stop.countDown();
            try {
                stopped.await(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));

        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(uri);
        if (factory.getVirtualHost().isEmpty()) {
            // amqp://host:5672/ means vhost "/" to the dispatcher (and most
            // clients); this client would read an empty vhost.
            factory.setVirtualHost("/");
        }
        boolean complete;
        try (Connection conn = factory.newConnection("dispatcher-example-consumer")) {
            Channel ch = conn.createChannel();
            // The same declaration as the dispatcher's operator's: a durable direct exchange.
            ch.exchangeDeclare(exchange, BuiltinExchangeType.DIRECT, true);
            if (durable) {
                ch.queueDeclare(queue, true, false, false, null); // durable, shared, kept after this consumer
            } else {
                ch.queueDeclare(queue, false, true, true, null); // exclusive, deleted with this connection
            }
            ch.queueBind(queue, exchange, routingKey);
            ch.basicQos(prefetch); // at most this many unacked messages at a time
            ch.basicConsume(queue, false, (consumerTag, d) -> c.handle(ch, d), consumerTag -> {
                System.err.println("Consumer: the broker cancelled the consumer (queue deleted?)");
                cancelled.set(1);
                stop.countDown();
            });
            System.out.println("ready: consuming " + queue + (durable ? " (durable, kept after this consumer)"
                    : " (exclusive, deleted when this consumer stops)") + ", bound to " + exchange + " with key "
                    + routingKey);

            long deadline = timeoutS > 0 ? System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutS) : Long.MAX_VALUE;
            while (!stop.await(50, TimeUnit.MILLISECONDS)) {
                long now = System.nanoTime();
                if (expect > 0 && c.done.size() >= expect
                        && now - c.lastDeliveryNanos >= TimeUnit.MILLISECONDS.toNanos(quietMs)) {
                    break;
                }
                if (now - deadline > 0) {
                    System.err.println("Consumer: timed out after " + timeoutS + " s");
                    break;
                }
            }
            complete = expect == 0 || c.done.size() >= expect;
            ch.close(); // unacked messages, if any, go back to the queue
        }
        System.out.println("summary: delivered " + c.done.size() + ", duplicates dropped " + c.duplicates.get()
                + ", rejected " + c.rejected.get());
        stopped.countDown();
        if (signalled.get() == 1) {
            return; // the JVM is already exiting, on a signal
        }
        System.exit(complete && cancelled.get() == 0 && c.rejected.get() == 0 ? 0 : 1);
    }
}

// A producer written for the rabbitmq-delayed-message-exchange plugin, moved
// to the dispatcher's AMQP ingress (docs/migrating-from-delayed-plugin.md), in
// Java 17 with the RabbitMQ Java client (Debian: librabbitmq-client-java). It
// publishes three orders with an x-delay header (ms, an Integer, as for the
// plugin), a routing key, a message_id and headers of several AMQP types, to
// the ingress exchange, with publisher confirms. The one change from the
// plugin: it no longer declares the exchange as x-delayed-message (the
// dispatcher declares it, a durable topic exchange).
//
//   javac -cp "$CP" -d /tmp/producer DelayedProducer.java
//   java -cp "/tmp/producer:$CP" DelayedProducer amqp://guest:guest@localhost:5672/ orders.delayed
//
// with CP=/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar:
// /usr/share/java/slf4j-simple.jar (one line). It prints "published
// <message_id> <routing key> <x-delay>" per order, once the broker confirmed
// them all. tests/ingress_clients_test.go runs it against a dispatcher and
// checks what a consumer of the queue's exchange receives.

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import java.io.IOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.Date;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

public final class DelayedProducer {
    public static void main(String[] args) throws Exception {
        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(args.length > 0 ? args[0] : "amqp://guest:guest@localhost:5672");
        if (factory.getVirtualHost().isEmpty()) {
            // amqp://host:5672/ means vhost "/" to the dispatcher (and most
            // clients); this client would read an empty vhost.
            factory.setVirtualHost("/");
        }
        String exchange = args.length > 1 ? args[1] : "orders.delayed";
        String[] keys = {"orders.created", "orders.paid", "orders.created"};
        int[] delays = {1_500, 800, 0};
        try (Connection connection = factory.newConnection(); Channel channel = connection.createChannel()) {
            // With the plugin, the producer declared the exchange:
            //   channel.exchangeDeclare(exchange, "x-delayed-message", true, false,
            //       Map.of("x-delayed-type", "topic"));
            // The dispatcher declares it: declare nothing (or the same durable topic exchange).
            channel.confirmSelect();
            for (int n = 0; n < keys.length; n++) {
                String orderId = "order-" + n;
                byte[] body = ("{\"order\":\"" + orderId + "\"}").getBytes(StandardCharsets.UTF_8);
                publish(channel, exchange, keys[n], orderId, delays[n], body);
            }
            channel.waitForConfirmsOrDie(10_000);
            for (int n = 0; n < keys.length; n++) {
                System.out.println("published order-" + n + " " + keys[n] + " " + delays[n]);
            }
        }
    }

    static void publish(Channel channel, String exchange, String routingKey, String orderId, int delayMs, byte[] body)
            throws IOException {
        Map<String, Object> headers = new HashMap<>(appHeaders());
        headers.put("x-delay", delayMs); // ms, an Integer: as for the plugin
        AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                .messageId(orderId) // the task's id: publish it again to reschedule
                .contentType("application/json")
                .contentEncoding("utf-8")
                .correlationId("corr-" + orderId)
                .replyTo("orders.replies")
                .type("order")
                .priority(3)
                .expiration("600000")
                .deliveryMode(2)
                .headers(headers)
                .build();
        channel.basicPublish(exchange, routingKey, props, body);
    }

    // appHeaders are the headers the service sends besides x-delay, one of
    // each AMQP type the Java client writes: they arrive with their types.
    static Map<String, Object> appHeaders() {
        Map<String, Object> h = new HashMap<>();
        h.put("tenant", "acme");
        h.put("attempt", (short) 1);
        h.put("region", (byte) 7);
        h.put("customer", 4_000_000_000L);
        h.put("gift", true);
        h.put("weight", 1.25);
        h.put("ratio", 0.5f);
        h.put("amount", new BigDecimal("19.99"));
        h.put("placed", new Date(1_767_225_600_000L));
        h.put("signature", new byte[] {0, 1, (byte) 254});
        h.put("tags", List.of("new", "eu"));
        h.put("meta", Map.of("source", "web", "version", 3));
        return h;
    }
}

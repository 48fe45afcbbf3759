#!/usr/bin/python3
"""A producer written for the rabbitmq-delayed-message-exchange plugin, moved
to the dispatcher's AMQP ingress (docs/migrating-from-delayed-plugin.md),
with pika (Debian: python3-pika). It publishes three orders with an x-delay
header (ms), a routing key, a message_id and headers of several AMQP types,
to the ingress exchange, with publisher confirms. The one change from the
plugin: it no longer declares the exchange as x-delayed-message (the
dispatcher declares it, a durable topic exchange).

    /usr/bin/python3 producer.py amqp://guest:guest@localhost:5672/ orders.delayed

It prints "published <message_id> <routing key> <x-delay>" per order, once
the broker confirmed them all. tests/ingress_clients_test.go runs it
against a dispatcher and checks what a consumer of the queue's exchange
receives.
"""
import datetime
import decimal
import json
import sys

import pika

# The headers the service sends besides x-delay, of several AMQP types: they
# arrive with their types. (pika 1.2, Debian 12's, cannot send a float.)
APP_HEADERS = {
    "tenant": "acme",
    "customer": 4000000000,
    "gift": True,
    "amount": decimal.Decimal("19.99"),
    "placed": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
    "signature": b"\x00\x01\xfe",
    "tags": ["new", "eu"],
    "meta": {"source": "web", "version": 3},
}

url = sys.argv[1] if len(sys.argv) > 1 else "amqp://guest:guest@localhost:5672/"
exchange = sys.argv[2] if len(sys.argv) > 2 else "orders.delayed"
conn = pika.BlockingConnection(pika.URLParameters(url))
ch = conn.channel()
# With the plugin, the producer declared the exchange:
#   ch.exchange_declare(exchange, "x-delayed-message", durable=True,
#                       arguments={"x-delayed-type": "topic"})
# The dispatcher declares it: declare nothing (or the same durable topic exchange).
ch.confirm_delivery()  # each basic_publish waits for the broker's confirm
orders = [("order-0", "orders.created", 1500), ("order-1", "orders.paid", 800), ("order-2", "orders.created", 0)]
for order_id, key, delay_ms in orders:
    body = json.dumps({"order": order_id}, separators=(",", ":")).encode()
    ch.basic_publish(exchange=exchange, routing_key=key, body=body,
                     properties=pika.BasicProperties(
                         message_id=order_id,  # the task's id: publish it again to reschedule
                         content_type="application/json", content_encoding="utf-8",
                         correlation_id="corr-" + order_id, reply_to="orders.replies", type="order",
                         priority=3, expiration="600000", delivery_mode=2,
                         headers={"x-delay": delay_ms, **APP_HEADERS}))  # ms, as for the plugin
for order_id, key, delay_ms in orders:
    print("published", order_id, key, delay_ms)
conn.close()

// A producer written for the rabbitmq-delayed-message-exchange plugin, moved
// to the dispatcher's AMQP ingress (docs/migrating-from-delayed-plugin.md),
// with amqplib from npm. It publishes three orders with an x-delay header
// (ms), a routing key, a messageId and headers of several AMQP types, to the
// ingress exchange, on a confirm channel. The one change from the plugin: it
// no longer asserts the exchange as x-delayed-message (the dispatcher
// declares it, a durable topic exchange).
//
//   npm ci && node producer.js amqp://guest:guest@localhost:5672/ orders.delayed
//
// It prints "published <messageId> <routing key> <x-delay>" per order, once
// the broker confirmed them all. tests/ingress_clients_test.go runs it
// against a dispatcher and checks what a consumer of the queue's exchange
// receives.
"use strict";
const amqp = require("amqplib");

// appHeaders are the headers the service sends besides x-delay, of several
// AMQP types: they arrive with their types. amqplib sends a whole number in
// the smallest integer type that holds it (x-delay too).
const appHeaders = {
  tenant: "acme",
  customer: 4000000000,
  gift: true,
  weight: 1.25,
  amount: {"!": "decimal", value: {places: 2, digits: 1999}},
  placed: {"!": "timestamp", value: 1767225600},
  signature: Buffer.from([0, 1, 254]),
  tags: ["new", "eu"],
  meta: {source: "web", version: 3},
};

async function main() {
  const url = process.argv[2] || "amqp://guest:guest@localhost:5672/";
  const exchange = process.argv[3] || "orders.delayed";
  const conn = await amqp.connect(url);
  const ch = await conn.createConfirmChannel();
  // With the plugin, the producer asserted the exchange:
  //   await ch.assertExchange(exchange, "x-delayed-message", {arguments: {"x-delayed-type": "topic"}});
  // The dispatcher declares it: assert nothing (or the same durable topic exchange).
  const orders = [
    {orderId: "order-0", key: "orders.created", delayMs: 1500},
    {orderId: "order-1", key: "orders.paid", delayMs: 100},
    {orderId: "order-2", key: "orders.created", delayMs: 0},
  ];
  for (const {orderId, key, delayMs} of orders) {
    const body = Buffer.from(JSON.stringify({order: orderId}));
    ch.publish(exchange, key, body, {
      messageId: orderId, // the task's id: publish it again to reschedule
      contentType: "application/json",
      contentEncoding: "utf-8",
      correlationId: `corr-${orderId}`,
      replyTo: "orders.replies",
      type: "order",
      priority: 3,
      expiration: "600000",
      persistent: true,
      headers: {"x-delay": delayMs, ...appHeaders}, // ms, as for the plugin
    });
  }
  await ch.waitForConfirms();
  for (const {orderId, key, delayMs} of orders) {
    console.log(`published ${orderId} ${key} ${delayMs}`);
  }
  await conn.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

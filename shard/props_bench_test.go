package shard_test

import (
	"testing"

	"github.com/dispatcher/dispatcher/shard"
)

// benchProps are the properties the bench's -props tasks carry (a
// traceparent, 85 bytes) and a fuller set, as a Spring producer's
// message through the AMQP ingress might leave.
var benchProps = map[string]string{
	"traceparent": `{"headers":{"traceparent":"00-0af7651916cd43dd0000000000000001-b7ad6b7169203331-01"}}`,
	"full":        `{"routing_key":"orders.timeout","headers":{"tenant":"acme","attempt":2,"urgent":true,"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},"content_type":"application/json","correlation_id":"order-42","reply_to":"orders.replies","type":"order.timeout","priority":5,"expiration_ms":60000,"deadline_ms":1767225660000,"message_id":"m-1","amqp_headers":{"x-b3":{"t":"S","v":"abc"}}}`,
}

func BenchmarkParseProperties(b *testing.B) {
	for name, in := range benchProps {
		b.Run(name, func(b *testing.B) {
			raw := []byte(in)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := shard.ParseProperties(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

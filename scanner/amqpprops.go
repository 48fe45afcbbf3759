package scanner

import (
	"github.com/dispatcher/dispatcher/internal/amqptable"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// withAMQPProps adds what the stored properties' extension fields give
// (CONTRACT.md, "The AMQP ingress"): headers of every AMQP type and the
// producer's message_id. ParseProperties checked amqp_headers is a JSON
// object; one that does not decode is left out, with a log line, rather
// than holding the task back.
func (s *Scanner) withAMQPProps(m *publisher.Message, p *shard.Properties) {
	if p.MessageID != "" {
		m.MessageID = p.MessageID
	}
	if len(p.AMQPHeaders) == 0 {
		return
	}
	t, err := amqptable.Decode(p.AMQPHeaders)
	if err != nil {
		s.lim.Error("amqp_headers", "task's amqp_headers left out", "task_id", m.TaskID, "err", err)
		return
	}
	if m.Headers == nil {
		m.Headers = make(map[string]any, len(t))
	}
	for k, v := range t {
		if !shard.ReservedHeader(k) {
			m.Headers[k] = v
		}
	}
}

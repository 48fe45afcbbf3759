package publisher

import (
	"errors"
	"fmt"
)

// Why a publish was not confirmed. Every one of them means "not published":
// the caller keeps the task and tries again.
var (
	// ErrNacked: the broker answered basic.nack.
	ErrNacked = errors.New("broker nacked the message")
	// ErrTimeout: no confirm within the confirm timeout, or no answer to
	// what a publish needs first (a channel of its own, room among the
	// unanswered publishes).
	ErrTimeout = errors.New("no confirm within the confirm timeout")
	// ErrNotConnected: there was no usable connection to publish on.
	ErrNotConnected = errors.New("not connected to the broker")
	// ErrStopped: the caller's context ended before the confirm came.
	ErrStopped = errors.New("stopped before the confirm came")
)

// ReturnedError: the broker returned the mandatory message as unroutable
// (no queue bound to the exchange with that routing key).
type ReturnedError struct {
	Code   uint16
	Reason string
}

func (e *ReturnedError) Error() string {
	return fmt.Sprintf("broker returned the message as unroutable (%d %s)", e.Code, e.Reason)
}

// LostError: the channel or connection closed before the confirm came.
// Refused is true when the broker closed the channel with 406
// PRECONDITION_FAILED, as it does for a message over its max_message_size;
// when one message alone gets that answer, the message itself is refused.
type LostError struct {
	Code    int
	Reason  string
	Refused bool
}

func (e *LostError) Error() string {
	if e.Code == 0 {
		return "connection to the broker lost before the confirm came: " + e.Reason
	}
	return fmt.Sprintf("broker closed the channel before the confirm came (%d %s)", e.Code, e.Reason)
}

// Kind names an error for metrics and logs: confirmed, nack, returned,
// timeout, refused, channel (another channel-level exception, such as 403
// or 404), lost, not_connected, stopped.
func Kind(err error) string {
	var re *ReturnedError
	var le *LostError
	switch {
	case err == nil:
		return "confirmed"
	case errors.Is(err, ErrNacked):
		return "nack"
	case errors.As(err, &re):
		return "returned"
	case errors.Is(err, ErrTimeout):
		return "timeout"
	case errors.As(err, &le) && le.Refused:
		return "refused"
	case errors.As(err, &le) && le.Code != 0:
		return "channel"
	case errors.As(err, &le):
		return "lost"
	case errors.Is(err, ErrNotConnected):
		return "not_connected"
	case errors.Is(err, ErrStopped):
		return "stopped"
	}
	return "other"
}

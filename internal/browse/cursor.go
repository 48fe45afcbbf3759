package browse

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Cursor is the last entry a walk looked at: the next walk goes on with
// the entries after it in the merged order (score, shard, member). It
// holds the member itself, not an offset, so that it stays right while
// tasks come and go, and costs O(log N) to resume however many tasks
// share its score.
type Cursor struct {
	State State
	Shard int
	Pos
}

// String writes the cursor for a command line:
// "<state>:<score>:<shard>:<member, base64url>".
func (c Cursor) String() string {
	return fmt.Sprintf("%s:%s:%d:%s", c.State, FormatScore(c.Score), c.Shard, base64.RawURLEncoding.EncodeToString([]byte(c.Member)))
}

// ErrCursor is ParseCursor's error: the text is not a Cursor's String.
var ErrCursor = errors.New("not a cursor printed by list")

// ParseCursor reads a Cursor's String.
func ParseCursor(s string) (Cursor, error) {
	parts := strings.SplitN(s, ":", 4)
	if len(parts) != 4 {
		return Cursor{}, ErrCursor
	}
	st, err := ParseState(parts[0])
	if err != nil {
		return Cursor{}, ErrCursor
	}
	score, err := strconv.ParseFloat(parts[1], 64)
	if err != nil {
		return Cursor{}, ErrCursor
	}
	i, err := strconv.Atoi(parts[2])
	if err != nil || i < 0 {
		return Cursor{}, ErrCursor
	}
	m, err := base64.RawURLEncoding.DecodeString(parts[3])
	if err != nil {
		return Cursor{}, ErrCursor
	}
	return Cursor{State: st, Shard: i, Pos: Pos{Score: score, Member: string(m)}}, nil
}

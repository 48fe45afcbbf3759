package redisconn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestCheckClassifies asks real servers: a private one with 16 databases,
// a password on the default user and ACL users, and one that is stopped.
// The refusals that waiting does not change come back as *RefusedError,
// naming what to change; the rest are waited for.
func TestCheckClassifies(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{"databases 16"}, Users: []string{
		"user default on >def-pw ~* &* +@all",
		"user noping on >noping-pw ~* &* +@all -ping",
		"user off off >off-pw ~* +@all",
	}})
	down := testenv.StartRedis(t, testenv.RedisOptions{})
	down.Kill()
	url := func(userinfo, db string) string { return "redis://" + userinfo + srv.Addr() + "/" + db }
	cases := []struct {
		name, url string
		want      string // in the error; "" for none
		permanent bool
	}{
		{"good", url("default:def-pw@", "15"), "", false},
		{"db out of range", url("default:def-pw@", "16"), "ERR DB index is out of range", true},
		{"wrong password", url("default:nope@", "0"), "WRONGPASS", true},
		{"user disabled", url("off:off-pw@", "0"), "WRONGPASS", true},
		{"no password", url("", "0"), "NOAUTH", true},
		{"no PING for the user", url("noping:noping-pw@", "0"), "NOPERM", true},
		{"server down", "redis://" + down.Addr() + "/0", "connection refused", false},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			rdb, err := Open(c.url)
			if err != nil {
				t.Fatal(err)
			}
			defer rdb.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = Check(ctx, rdb)
			if c.want == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			var re *RefusedError
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.As(err, &re) != c.permanent || Permanent(err) != c.permanent {
				t.Fatalf("Check: %v (%T); want an error with %q, permanent %v", err, err, c.want, c.permanent)
			}
			if c.permanent && (!strings.Contains(err.Error(), srv.Addr()) || !strings.Contains(err.Error(), "refuses it")) {
				t.Errorf("error %q does not name the server and what to change", err)
			}
		})
	}
}

func TestPermanentIgnoresTransient(t *testing.T) {
	for _, err := range []error{nil, errors.New("WRONGPASS but not from Redis"), context.DeadlineExceeded} {
		if Permanent(err) {
			t.Errorf("Permanent(%v)", err)
		}
	}
}

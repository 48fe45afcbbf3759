package redisconn

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestParseModes(t *testing.T) {
	cases := []struct {
		url   string
		mode  Mode
		addrs []string
		tls   bool
	}{
		{"redis://localhost:6379/0", Single, []string{"localhost:6379"}, false},
		{"rediss://u:pw@r.example:6380/2", Single, []string{"r.example:6380"}, true},
		{"redis+cluster://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", Cluster,
			[]string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}, false},
		{"REDISS+CLUSTER://u:pw@c.example:7000", Cluster, []string{"c.example:7000"}, true},
		{"redis+sentinel://127.0.0.1:26379?addr=127.0.0.1:26380&master_name=mymaster", Sentinel,
			[]string{"127.0.0.1:26379", "127.0.0.1:26380"}, false},
		{"rediss+sentinel://s.example:26379?master_name=m&password=pw", Sentinel, []string{"s.example:26379"}, true},
	}
	for _, c := range cases {
		o, err := Parse(c.url)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.url, err)
			continue
		}
		if o.Mode != c.mode || strings.Join(o.Addrs(), ",") != strings.Join(c.addrs, ",") || (o.TLSConfig() != nil) != c.tls {
			t.Errorf("Parse(%q) = mode %s, addrs %v, tls %v; want %s, %v, %v", c.url, o.Mode, o.Addrs(), o.TLSConfig() != nil, c.mode, c.addrs, c.tls)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for url, want := range map[string]string{
		"localhost:6379":                               "no scheme",
		"http://localhost:6379":                        `scheme "http"`,
		"redis+shard://localhost":                      `scheme "redis+shard"`,
		"redis+sentinel://127.0.0.1:26379":             "master_name= is required",
		"redis+cluster://127.0.0.1:7000?bogus=1":       "unexpected option",
		"redis+sentinel://h:1?master_name=m&addr=nope": "addr",
	} {
		_, err := Parse(url)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", url, err, want)
		}
	}
}

func TestSentinelCredentials(t *testing.T) {
	// go-redis's own rule: the user info authenticates to the sentinels,
	// username=/password= to the primary.
	o, err := Parse("redis+sentinel://su:spw@127.0.0.1:26379?master_name=m&username=app&password=apw")
	if err != nil {
		t.Fatal(err)
	}
	f := o.failover
	if f.SentinelUsername != "su" || f.SentinelPassword != "spw" || f.Username != "app" || f.Password != "apw" {
		t.Errorf("credentials: sentinel %q/%q, primary %q/%q", f.SentinelUsername, f.SentinelPassword, f.Username, f.Password)
	}
}

func TestDefaultTimeoutsKeepURLValues(t *testing.T) {
	o, _ := Parse("redis+cluster://127.0.0.1:7000?read_timeout=7s&max_retries=4")
	o.SetDefaultTimeouts()
	if o.cluster.ReadTimeout.Seconds() != 7 || o.cluster.MaxRetries != 4 {
		t.Errorf("URL's timeouts overridden: %v %d", o.cluster.ReadTimeout, o.cluster.MaxRetries)
	}
	o, _ = Parse("redis+sentinel://127.0.0.1:26379?master_name=m")
	o.SetDefaultTimeouts()
	if o.failover.ReadTimeout.Seconds() != 3 || o.failover.MaxRetries != 1 {
		t.Errorf("defaults not set: %v %d", o.failover.ReadTimeout, o.failover.MaxRetries)
	}
}

func TestNewClientTypes(t *testing.T) {
	for url, want := range map[string]string{
		"redis://127.0.0.1:1":                        "*redis.Client",
		"redis+cluster://127.0.0.1:1":                "*redis.ClusterClient",
		"redis+sentinel://127.0.0.1:1?master_name=m": "*redis.Client",
	} {
		c, err := Open(url)
		if err != nil {
			t.Fatal(err)
		}
		got := "?"
		switch c.(type) {
		case *redis.Client:
			got = "*redis.Client"
		case *redis.ClusterClient:
			got = "*redis.ClusterClient"
		}
		c.Close()
		if got != want {
			t.Errorf("Open(%q) is %s, want %s", url, got, want)
		}
	}
}

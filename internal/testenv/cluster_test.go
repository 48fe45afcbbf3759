package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func timedStep(t *testing.T, what string) func() {
	start := time.Now()
	return func() { t.Logf("%s: %s", what, time.Since(start).Round(time.Millisecond)) }
}

func startTestCluster(t *testing.T) *RedisCluster {
	defer timedStep(t, "cluster start")()
	return StartRedisCluster(t, ClusterOptions{})
}

func TestRedisClusterStarts(t *testing.T) {
	c := startTestCluster(t)
	ctx := context.Background()
	if p, r := len(c.Primaries()), len(c.Replicas()); p != 3 || r != 3 {
		t.Fatalf("%d primaries, %d replicas; want 3 and 3", p, r)
	}
	for _, p := range c.Primaries() {
		if r := c.ReplicaOf(p); r == nil || r.PrimaryID != p.ID {
			t.Fatalf("primary %s has no replica (%v)", p, r)
		}
	}
	if !strings.HasPrefix(c.URL(), "redis+cluster://127.0.0.1:") || strings.Count(c.URL(), "addr=127.0.0.1:") != 2 {
		t.Fatalf("URL %s", c.URL())
	}
	cc := c.Client()
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("k%d", i)
		if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := cc.Get(ctx, k).Int(); err != nil || v != i {
			t.Fatalf("get %s = %v, %v", k, v, err)
		}
		// The key is on the primary PrimaryOf names, and on no other.
		p := c.PrimaryOf(k)
		if !p.Serves(c.Slot(k)) {
			t.Fatalf("%s does not serve slot %d of %s", p, c.Slot(k), k)
		}
		if v, err := p.Server.Client().Get(ctx, k).Int(); err != nil || v != i {
			t.Fatalf("GET %s on %s: %v, %v", k, p, v, err)
		}
	}
}

func TestRedisClusterFailover(t *testing.T) {
	c := startTestCluster(t)
	p := c.PrimaryOf("fo")
	r := c.ReplicaOf(p)
	done := timedStep(t, "manual failover")
	np := c.Failover(r)
	done()
	if !np.IsPrimary() || np.ID != r.ID || !np.Serves(c.Slot("fo")) {
		t.Fatalf("after failover: %s", np)
	}
	if old := c.node(p.ID); old.IsPrimary() || old.PrimaryID != r.ID {
		t.Fatalf("old primary is %s replicating %.8s", old, old.PrimaryID)
	}
	if err := c.Client().Set(context.Background(), "fo", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestRedisClusterKillPrimary(t *testing.T) {
	c := startTestCluster(t)
	ctx := context.Background()
	cc := c.Client()
	if err := cc.Set(ctx, "kp", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := c.PrimaryOf("kp")
	r := c.ReplicaOf(p)
	// WAIT: the replica has the key before the primary dies.
	if n, err := p.Server.Client().Do(ctx, "WAIT", 1, 2000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %v %v", n, err)
	}
	c.KillPrimary(p)
	done := timedStep(t, "kill primary -> promoted")
	np := c.WaitPromoted(p, 20*time.Second)
	done()
	if np.ID != r.ID {
		t.Fatalf("promoted %s, want %s", np, r)
	}
	// The cluster client learns of the promotion lazily: until its next
	// state reload it may still dial the dead primary.
	done = timedStep(t, "client reads after promotion")
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := cc.Get(ctx, "kp").Result()
		if err == nil && v == "v" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("get after promotion: %q %v", v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	done()
	done = timedStep(t, "restart old primary")
	old := c.Restart(p)
	done()
	if old.IsPrimary() || old.PrimaryID != np.ID {
		t.Fatalf("restarted old primary is %s replicating %.8s", old, old.PrimaryID)
	}
}

func TestRedisClusterPause(t *testing.T) {
	c := startTestCluster(t)
	defer timedStep(t, "pause test body")()
	ctx := context.Background()
	p := c.PrimaryOf("pz")
	// go-redis ignores context deadlines without ContextTimeoutEnabled
	// (a PING to a paused node then waits out ReadTimeout, retries and all).
	pc := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	defer pc.Close()
	if err := pc.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	c.Pause(p)
	d := timedStep(t, "ping paused")
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := pc.Ping(short).Err()
	cancel()
	d()
	if err == nil {
		t.Fatal("a paused node answered PING")
	}
	if n := c.Nodes(); !n[clusterIndexOf(c, p)].Down {
		t.Fatal("paused node not Down")
	}
	d = timedStep(t, "nodes while paused")
	_ = c.Nodes()
	d()
	c.Resume(p)
	d = timedStep(t, "ping resumed")
	if err := pc.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after resume: %v", err)
	}
	d()
	done := timedStep(t, "healthy after resume")
	c.WaitHealthy(10 * time.Second)
	done()

	// Paused past the node timeout, a primary is failed over; resumed, it
	// rejoins as a replica.
	p = c.PrimaryOf("pz")
	c.Pause(p)
	done = timedStep(t, "pause primary -> promoted")
	np := c.WaitPromoted(p, 20*time.Second)
	done()
	c.Resume(p)
	done = timedStep(t, "resumed old primary rejoins")
	c.WaitHealthy(20 * time.Second)
	done()
	if old := c.node(p.ID); old.IsPrimary() || old.PrimaryID != np.ID {
		t.Fatalf("resumed old primary is %s replicating %.8s", old, old.PrimaryID)
	}

	// Left paused: cleanup must still stop it.
	c.Pause(c.Replicas()[0])
}

func clusterIndexOf(c *RedisCluster, n *ClusterNode) int {
	for i, s := range c.servers {
		if s == n.Server {
			return i
		}
	}
	return -1
}

func TestRedisClusterMigrateSlot(t *testing.T) {
	c := startTestCluster(t)
	ctx := context.Background()
	cc := c.Client()
	slot := c.Slot("{mig}")
	keys := make([]string, 250)
	for i := range keys {
		keys[i] = fmt.Sprintf("{mig}:%d", i)
		if err := cc.Set(ctx, keys[i], i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	src := c.PrimaryOfSlot(slot)
	var dst *ClusterNode
	for _, p := range c.Primaries() {
		if p.ID != src.ID {
			dst = p
			break
		}
	}
	done := timedStep(t, "migrate slot with 250 keys")
	if err := c.MigrateSlot(ctx, slot, dst); err != nil {
		t.Fatal(err)
	}
	done()
	if now := c.PrimaryOfSlot(slot); now.ID != dst.ID {
		t.Fatalf("slot %d on %s, want %s", slot, now, dst)
	}
	if n, _ := src.Server.Client().ClusterCountKeysInSlot(ctx, slot).Result(); n != 0 {
		t.Fatalf("%d keys left on source", n)
	}
	for i, k := range keys {
		if v, err := cc.Get(ctx, k).Int(); err != nil || v != i {
			t.Fatalf("get %s after migration: %v %v", k, v, err)
		}
	}

	// Slowly back, while a writer adds keys to the moving slot and bumps
	// old ones: single-key commands meet ASK, which the client follows;
	// multi-key ones may meet TRYAGAIN (keys split between the nodes).
	done = timedStep(t, "slow migration back with concurrent writes")
	stop := make(chan struct{})
	werr := make(chan error, 1)
	// Errors of multi-key commands by first word: MGET and a 2-key EVAL.
	multi := map[string]int{}
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				werr <- nil
				return
			default:
			}
			k := fmt.Sprintf("{mig}:new%d", i)
			if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
				werr <- fmt.Errorf("set %s during migration: %w", k, err)
				return
			}
			if err := cc.Incr(ctx, keys[i%len(keys)]).Err(); err != nil {
				werr <- fmt.Errorf("incr %s during migration: %w", keys[i%len(keys)], err)
				return
			}
			two := []string{keys[0], keys[len(keys)-1]}
			for name, err := range map[string]error{
				"MGET": cc.MGet(ctx, two...).Err(),
				"EVAL": cc.Eval(ctx, "return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}", two).Err(),
			} {
				first := "ok"
				if err != nil && err != redis.Nil {
					first, _, _ = strings.Cut(err.Error(), " ")
				}
				multi[name+" "+first]++
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	err := c.MigrateSlotSlowly(ctx, slot, src, 20*time.Millisecond)
	close(stop)
	if werr := <-werr; werr != nil {
		t.Error(werr)
	}
	t.Logf("multi-key commands during the migration: %v", multi)
	if err != nil {
		t.Fatal(err)
	}
	done()
	if now := c.PrimaryOfSlot(slot); now.ID != src.ID {
		t.Fatalf("slot %d on %s, want %s", slot, now, src)
	}
	n, err := cc.ClusterCountKeysInSlot(ctx, slot).Result()
	if err != nil {
		t.Fatal(err)
	}
	if cnt, _ := src.Server.Client().ClusterCountKeysInSlot(ctx, slot).Result(); cnt < 250 {
		t.Fatalf("%d keys in slot on its primary (client says %d)", cnt, n)
	}
	for i, k := range keys {
		if v, err := cc.Get(ctx, k).Int(); err != nil || v < i {
			t.Fatalf("get %s after migration back: %v %v", k, v, err)
		}
	}
}

func TestRedisSentinelFailover(t *testing.T) {
	done := timedStep(t, "sentinel start")
	rs := StartRedisSentinel(t, SentinelOptions{})
	done()
	ctx := context.Background()
	if !strings.Contains(rs.URL(), "master_name=mymaster") || strings.Count(rs.URL(), "addr=") != 2 {
		t.Fatalf("URL %s", rs.URL())
	}
	c := rs.Client()
	if err := c.Set(ctx, "s", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old := rs.Primary()
	if rs.Replica() == old {
		t.Fatal("replica is the primary")
	}
	if n, err := old.Client().Do(ctx, "WAIT", 1, 2000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %v %v", n, err)
	}
	rs.KillPrimary()
	done = timedStep(t, "sentinel kill primary -> failover")
	np := rs.WaitFailover(old.Addr(), 30*time.Second)
	done()
	if np == old || rs.Primary() != np {
		t.Fatalf("new primary %s, old %s", np, old)
	}
	if v, err := c.Get(ctx, "s").Result(); err != nil || v != "v" {
		t.Fatalf("get after failover: %q %v", v, err)
	}
}

// TestRedisClusterTLSAndACL: a cluster that speaks TLS only (client
// certificates required) on the client port, the cluster bus and for
// replication, with the default user off: the helpers, Client, redis-cli
// and the replicas use the admin user; URL, given a user's credentials and
// the TLS files, reaches it; plain TCP and the default user are refused;
// failover, slot migration and a restart of a killed node work.
func TestRedisClusterTLSAndACL(t *testing.T) {
	certs := NewCerts(t)
	done := timedStep(t, "TLS+ACL cluster start")
	c := StartRedisCluster(t, ClusterOptions{TLS: &certs, Users: []string{"user default off"}})
	done()
	ctx := context.Background()
	if p, r := len(c.Primaries()), len(c.Replicas()); p != 3 || r != 3 {
		t.Fatalf("%d primaries, %d replicas; want 3 and 3", p, r)
	}
	u := c.URL()
	if !strings.HasPrefix(u, "rediss+cluster://127.0.0.1:") || strings.Count(u, "addr=127.0.0.1:") != 2 || strings.Contains(u, "@") {
		t.Fatalf("URL %s", u)
	}
	if c.AdminPassword() == "" {
		t.Fatal("no admin password with Users")
	}
	for _, s := range c.Servers() {
		cl := s.Client()
		if v, err := cl.ConfigGet(ctx, "tls-cluster").Result(); err != nil || v["tls-cluster"] != "yes" {
			t.Fatalf("tls-cluster on %s: %v %v", s, v, err)
		}
		if v, err := cl.ConfigGet(ctx, "port").Result(); err != nil || v["port"] != "0" {
			t.Fatalf("port on %s: %v %v", s, v, err)
		}
	}

	cc := c.Client()
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("k%d", i)
		if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := c.PrimaryOf(k).Server.Client().Get(ctx, k).Int(); err != nil || v != i {
			t.Fatalf("GET %s on its primary: %v, %v", k, v, err)
		}
	}

	// A user with the URL's seeds, its own credentials and the TLS files.
	if err := forEachNode(c, "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all"); err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseClusterURL("rediss://app:app-pw@" + strings.TrimPrefix(u, "rediss+cluster://"))
	if err != nil {
		t.Fatal(err)
	}
	opt.TLSConfig = c.clientTLS()
	app := redis.NewClusterClient(opt)
	defer app.Close()
	if v, err := app.Get(ctx, "k7").Int(); err != nil || v != 7 {
		t.Fatalf("GET through URL as app: %v %v", v, err)
	}
	if who, err := app.Do(ctx, "ACL", "WHOAMI").Text(); err != nil || who != "app" {
		t.Fatalf("ACL WHOAMI through URL: %q %v", who, err)
	}

	// Refused: plain TCP, TLS without a client certificate, the default user.
	addr := c.Servers()[0].Addr()
	plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("a node answered plain TCP")
	}
	noCert := c.clientTLS()
	noCert.Certificates = nil
	anon := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: noCert, MaxRetries: -1})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil {
		t.Fatal("a node answered TLS without a client certificate")
	}
	dflt := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: c.clientTLS(), MaxRetries: -1})
	defer dflt.Close()
	if err := dflt.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("the default user: %v, want NOAUTH", err)
	}

	// Replication (tls-replication, masteruser) carries the writes: a
	// failover loses none; MIGRATE (TLS, AUTH2) moves a slot.
	pr := c.PrimaryOf("k3")
	if n, err := pr.Server.Client().Do(ctx, "WAIT", 1, 2000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %v %v", n, err)
	}
	done = timedStep(t, "TLS manual failover")
	np := c.Failover(c.ReplicaOf(pr))
	done()
	if v, err := np.Server.Client().Get(ctx, "k3").Int(); err != nil || v != 3 {
		t.Fatalf("GET k3 on the promoted replica: %v %v", v, err)
	}
	slot := c.Slot("k5")
	var dst *ClusterNode
	for _, q := range c.Primaries() {
		if !q.Serves(slot) {
			dst = q
			break
		}
	}
	done = timedStep(t, "TLS migrate slot")
	if err := c.MigrateSlot(ctx, slot, dst); err != nil {
		t.Fatal(err)
	}
	done()
	if v, err := dst.Server.Client().Get(ctx, "k5").Int(); err != nil || v != 5 {
		t.Fatalf("GET k5 on the slot's new primary: %v %v", v, err)
	}
	// A killed replica restarts with its ACL file (the admin password) and
	// resyncs over TLS.
	r := c.Replicas()[0]
	c.KillPrimary(r)
	done = timedStep(t, "TLS restart replica")
	c.Restart(r)
	done()
	if v, err := r.Server.Client().Do(ctx, "ROLE").Slice(); err != nil || len(v) == 0 || v[0] != "slave" {
		t.Fatalf("ROLE of the restarted replica: %v %v", v, err)
	}
	if err := cc.Set(ctx, "after", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// forEachNode runs a command on every node as the admin user.
func forEachNode(c *RedisCluster, args ...any) error {
	for _, s := range c.Servers() {
		if err := c.admin(s).Do(context.Background(), args...).Err(); err != nil {
			return fmt.Errorf("%v on %s: %w", args[:2], s.Addr(), err)
		}
	}
	return nil
}

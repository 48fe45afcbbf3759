package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterOptions configure StartRedisCluster. The zero value is 3 primaries
// with one replica each and a 1 s node timeout.
type ClusterOptions struct {
	// Primaries is the number of primaries (at least 3; 0 means 3).
	Primaries int
	// ReplicasPer is the number of replicas of each primary; 0 means 1,
	// a negative number none.
	ReplicasPer int
	// NodeTimeout is cluster-node-timeout (0 means 1 s): a primary that
	// does not answer for that long is failed over.
	NodeTimeout time.Duration
	// Args are extra config lines for every node.
	Args []string
	// TLS, when set, makes every node speak TLS only (port 0, tls-port),
	// on the cluster bus and for replication too (tls-cluster,
	// tls-replication), with these certificates, and demand a client
	// certificate from every client (tls-auth-clients yes). Nodes connect
	// to each other with Certs.ClientCert. URL is then rediss+cluster://,
	// and Client, the helpers and redis-cli use TLS with the client
	// certificate.
	TLS *Certs
	// Users are ACL file lines for every node, e.g. "user default off".
	// When any is given, every node also has the user "admin" with every
	// right and one password on all nodes (AdminPassword): the helpers,
	// Client, redis-cli and the replicas (masteruser) authenticate as it.
	// ACLs are per node: a test that adds users later (ACL SETUSER) does
	// so on every node.
	Users []string
}

// RedisCluster is a private Redis Cluster of redis-server processes owned
// by one test, all stopped when the test ends.
type RedisCluster struct {
	t       testing.TB
	opt     ClusterOptions
	servers []*RedisServer
	seeds   []string    // the first primaries, for URL and Client
	tls     *tls.Config // for clients, with TLS
	user    string      // admin user and password for clients, with Users
	pass    string

	mu      sync.Mutex
	clients map[*RedisServer]*redis.Client
	users   []*redis.ClusterClient // from Client, told to reload after topology changes
}

// ClusterNode is one node of a RedisCluster as the cluster sees it at the
// time of the call (roles and slots change with failovers and migrations).
type ClusterNode struct {
	Addr      string   // 127.0.0.1:port
	ID        string   // cluster node id
	Role      string   // "primary" or "replica"
	PrimaryID string   // the id of the primary a replica replicates; "" for a primary
	Slots     [][2]int // slot ranges [first, last] a primary serves
	Flags     []string // flags from CLUSTER NODES, e.g. "fail", "fail?"
	// Down is true when the process is killed or paused; the node's fields
	// then come from another node's view.
	Down   bool
	Server *RedisServer
}

// IsPrimary reports whether the node is a primary.
func (n *ClusterNode) IsPrimary() bool { return n.Role == "primary" }

// Serves reports whether the primary n serves slot.
func (n *ClusterNode) Serves(slot int) bool {
	for _, r := range n.Slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// String names the node in messages.
func (n *ClusterNode) String() string {
	return fmt.Sprintf("%s %s %.8s", n.Role, n.Addr, n.ID)
}

// StartRedisCluster starts a Redis Cluster of private redis-servers, creates
// it with redis-cli --cluster create and waits until every node reports
// cluster_state:ok, all agree on slots and roles, and replicas are in sync.
func StartRedisCluster(t testing.TB, opt ClusterOptions) *RedisCluster {
	t.Helper()
	if opt.Primaries == 0 {
		opt.Primaries = 3
	}
	if opt.Primaries < 3 {
		t.Fatalf("Redis Cluster needs at least 3 primaries, not %d", opt.Primaries)
	}
	if opt.ReplicasPer == 0 {
		opt.ReplicasPer = 1
	}
	if opt.ReplicasPer < 0 {
		opt.ReplicasPer = 0
	}
	if opt.NodeTimeout == 0 {
		opt.NodeTimeout = time.Second
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli not installed: %v", err)
	}
	c := &RedisCluster{t: t, opt: opt, clients: map[*RedisServer]*redis.Client{}}
	t.Cleanup(c.closeClients)
	var secure []string // config lines for TLS and ACL
	if opt.TLS != nil {
		secure = append(secure, "tls-cluster yes", "tls-replication yes",
			// The server certificate is for servers only (its extended key
			// usage): as a client of other nodes, a node shows the client's.
			"tls-client-cert-file "+opt.TLS.ClientCert, "tls-client-key-file "+opt.TLS.ClientKey)
	}
	if len(opt.Users) > 0 {
		c.user, c.pass = "admin", "admin-"+randomHex()
		secure = append(secure, "masteruser "+c.user, "masterauth "+c.pass)
	}
	n := opt.Primaries * (1 + opt.ReplicasPer)
	addrs := make([]string, 0, n)
	for i := 0; i < n; i++ {
		args := []string{
			"cluster-enabled yes",
			"cluster-config-file nodes.conf",
			"cluster-node-timeout " + strconv.FormatInt(opt.NodeTimeout.Milliseconds(), 10),
			// Any replica may be promoted, however long it was cut off.
			"cluster-replica-validity-factor 0",
			// Keep the topology as the test made it.
			"cluster-allow-replica-migration no",
			"enable-debug-command local",
			"repl-diskless-sync yes",
			"repl-diskless-sync-delay 0",
			"repl-ping-replica-period 1",
		}
		args = append(args, secure...)
		// The bus port (cluster-port) is drawn with the port: its default,
		// port+10000, may be past 65535 or taken.
		s := StartRedis(t, RedisOptions{TLS: opt.TLS, TLSAuthClients: opt.TLS != nil, Users: opt.Users,
			Args: append(args, opt.Args...), clusterBus: true})
		if c.user != "" {
			c.sharePassword(s)
		}
		if c.tls == nil && opt.TLS != nil {
			c.tls = s.clientTLS()
		}
		c.servers = append(c.servers, s)
		addrs = append(addrs, s.Addr())
	}
	for i := 0; i < opt.Primaries; i++ {
		c.seeds = append(c.seeds, addrs[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append(c.cliArgs(), "--cluster", "create")
	args = append(args, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(opt.ReplicasPer), "--cluster-yes")
	cli := exec.CommandContext(ctx, "redis-cli", args...)
	if c.pass != "" {
		// Not on the command line, where ps would show it.
		cli.Env = append(os.Environ(), "REDISCLI_AUTH="+c.pass)
	}
	out, err := cli.CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s\n%s", err, out, c.logTails())
	}
	c.WaitHealthy(20 * time.Second)
	// redis-cli makes the first Primaries addresses primaries; keep the
	// seeds right even if it ever did otherwise.
	c.seeds = c.seeds[:0]
	for _, p := range c.Primaries() {
		c.seeds = append(c.seeds, p.Addr)
	}
	return c
}

// sharePassword gives the admin user StartRedis added to s the cluster's
// admin password, which redis-cli and the replicas (masterauth) need to be
// the same on every node, and saves it to the ACL file for restarts.
func (c *RedisCluster) sharePassword(s *RedisServer) {
	c.t.Helper()
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		c.t.Fatal(err)
	}
	if c.opt.TLS != nil {
		opt.TLSConfig = s.clientTLS()
	}
	cl := redis.NewClient(opt)
	defer cl.Close()
	ctx := context.Background()
	if err := cl.Do(ctx, "ACL", "SETUSER", c.user, "resetpass", ">"+c.pass).Err(); err != nil {
		c.t.Fatalf("ACL SETUSER %s on %s: %v", c.user, s.Addr(), err)
	}
	if err := cl.Do(ctx, "ACL", "SAVE").Err(); err != nil {
		c.t.Fatalf("ACL SAVE on %s: %v", s.Addr(), err)
	}
	s.adminPwd = c.pass // no one else has s yet
}

// cliArgs are redis-cli's connection flags: TLS and the admin user.
func (c *RedisCluster) cliArgs() []string {
	var args []string
	if c.opt.TLS != nil {
		args = append(args, "--tls", "--cacert", c.opt.TLS.CA,
			"--cert", c.opt.TLS.ClientCert, "--key", c.opt.TLS.ClientKey)
	}
	if c.user != "" {
		// The password comes from REDISCLI_AUTH.
		args = append(args, "--user", c.user)
	}
	return args
}

// AdminPassword is the password of the user "admin" on every node when
// ClusterOptions.Users is set, "" otherwise.
func (c *RedisCluster) AdminPassword() string { return c.pass }

// clientTLS is a fresh copy of the clients' TLS configuration (nil without
// TLS): CA, client certificate and ServerName 127.0.0.1.
func (c *RedisCluster) clientTLS() *tls.Config {
	if c.tls == nil {
		return nil
	}
	return c.tls.Clone()
}

// URL is the cluster's redis+cluster:// URL with the primaries at start as
// seeds: redis+cluster://127.0.0.1:p1?addr=127.0.0.1:p2&addr=..., with
// TLS rediss+cluster://. It carries no credentials (with Users, a test
// adds its user's) and no TLS files.
func (c *RedisCluster) URL() string {
	scheme := "redis+cluster://"
	if c.opt.TLS != nil {
		scheme = "rediss+cluster://"
	}
	u := scheme + c.seeds[0]
	for i, a := range c.seeds[1:] {
		if i == 0 {
			u += "?addr=" + a
		} else {
			u += "&addr=" + a
		}
	}
	return u
}

// Client returns a new cluster client seeded with every node (TLS and the
// admin user handled), closed when the test ends. Failover, WaitPromoted,
// Restart and MigrateSlot make it reload the slot map: go-redis does not
// by itself after a dial error.
func (c *RedisCluster) Client() *redis.ClusterClient {
	addrs := make([]string, len(c.servers))
	for i, s := range c.servers {
		addrs[i] = s.Addr()
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs,
		TLSConfig: c.clientTLS(), Username: c.user, Password: c.pass})
	c.mu.Lock()
	c.users = append(c.users, cc)
	c.mu.Unlock()
	c.t.Cleanup(func() { cc.Close() })
	return cc
}

// reloadClients has the clients from Client reload their slot maps.
func (c *RedisCluster) reloadClients() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.users {
		cc.ReloadState(context.Background())
	}
}

// Servers returns every node's process, in start order.
func (c *RedisCluster) Servers() []*RedisServer { return append([]*RedisServer(nil), c.servers...) }

// admin is a cached plain client of one node, with short timeouts so a
// paused node does not hang the helpers.
func (c *RedisCluster) admin(s *RedisServer) *redis.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.clients[s]
	if cl == nil {
		cl = redis.NewClient(&redis.Options{
			Addr: s.Addr(), MaxRetries: -1, PoolSize: 4,
			DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second,
			TLSConfig: c.clientTLS(), Username: c.user, Password: c.pass,
		})
		c.clients[s] = cl
	}
	return cl
}

func (c *RedisCluster) closeClients() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cl := range c.clients {
		cl.Close()
	}
	c.clients = nil
}

func serverLive(s *RedisServer) bool { return s.Running() && !s.Paused() }

// Nodes returns every node, fresh from CLUSTER NODES: each live node's own
// line, other nodes' view for a killed or paused one.
func (c *RedisCluster) Nodes() []*ClusterNode {
	c.t.Helper()
	ns, err := c.nodes(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	return ns
}

func (c *RedisCluster) nodes(ctx context.Context) ([]*ClusterNode, error) {
	self := map[*RedisServer]*ClusterNode{}
	seen := map[string]*ClusterNode{}
	var lastErr error
	for _, s := range c.servers {
		if !serverLive(s) {
			continue
		}
		view, err := c.view(ctx, s)
		if err != nil {
			lastErr = err
			continue
		}
		for _, n := range view {
			if n.Addr == s.Addr() {
				self[s] = n
			} else if seen[n.Addr] == nil {
				seen[n.Addr] = n
			}
		}
	}
	if len(self) == 0 {
		return nil, fmt.Errorf("no cluster node answers CLUSTER NODES: %v", lastErr)
	}
	out := make([]*ClusterNode, 0, len(c.servers))
	for _, s := range c.servers {
		n := self[s]
		if n == nil {
			n = seen[s.Addr()]
			if n == nil {
				n = &ClusterNode{Addr: s.Addr()}
			}
			n.Down = true
		}
		n.Server = s
		out = append(out, n)
	}
	return out, nil
}

// view is one node's CLUSTER NODES, parsed.
func (c *RedisCluster) view(ctx context.Context, s *RedisServer) ([]*ClusterNode, error) {
	txt, err := c.admin(s).ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER NODES on %s: %w", s.Addr(), err)
	}
	var out []*ClusterNode
	for _, line := range strings.Split(strings.TrimSpace(txt), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr := f[1]
		if i := strings.IndexAny(addr, "@,"); i >= 0 {
			addr = addr[:i]
		}
		if _, port, err := net.SplitHostPort(addr); err == nil {
			addr = "127.0.0.1:" + port
		}
		n := &ClusterNode{Addr: addr, ID: f[0], Flags: strings.Split(f[2], ",")}
		n.Role = "primary"
		for _, fl := range n.Flags {
			if fl == "slave" {
				n.Role = "replica"
			}
		}
		if n.Role == "replica" && f[3] != "-" {
			n.PrimaryID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being imported or migrated
			}
			a, b, _ := strings.Cut(r, "-")
			lo, err1 := strconv.Atoi(a)
			hi := lo
			var err2 error
			if b != "" {
				hi, err2 = strconv.Atoi(b)
			}
			if err1 == nil && err2 == nil {
				n.Slots = append(n.Slots, [2]int{lo, hi})
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// Primaries returns the nodes that are primaries and serve slots now.
func (c *RedisCluster) Primaries() []*ClusterNode {
	c.t.Helper()
	var out []*ClusterNode
	for _, n := range c.Nodes() {
		if n.IsPrimary() && len(n.Slots) > 0 {
			out = append(out, n)
		}
	}
	return out
}

// Replicas returns the nodes that are replicas now.
func (c *RedisCluster) Replicas() []*ClusterNode {
	c.t.Helper()
	var out []*ClusterNode
	for _, n := range c.Nodes() {
		if !n.IsPrimary() {
			out = append(out, n)
		}
	}
	return out
}

// Slot returns key's hash slot (CLUSTER KEYSLOT).
func (c *RedisCluster) Slot(key string) int {
	c.t.Helper()
	for _, s := range c.servers {
		if !serverLive(s) {
			continue
		}
		slot, err := c.admin(s).ClusterKeySlot(context.Background(), key).Result()
		if err == nil {
			return int(slot)
		}
	}
	c.t.Fatalf("no cluster node answers CLUSTER KEYSLOT")
	return -1
}

// PrimaryOf returns the primary that serves key's slot now.
func (c *RedisCluster) PrimaryOf(key string) *ClusterNode {
	c.t.Helper()
	return c.PrimaryOfSlot(c.Slot(key))
}

// PrimaryOfSlot returns the primary that serves slot now.
func (c *RedisCluster) PrimaryOfSlot(slot int) *ClusterNode {
	c.t.Helper()
	for _, n := range c.Nodes() {
		if n.IsPrimary() && n.Serves(slot) {
			return n
		}
	}
	c.t.Fatalf("no primary serves slot %d", slot)
	return nil
}

// ReplicaOf returns a replica of primary now, nil if it has none.
func (c *RedisCluster) ReplicaOf(primary *ClusterNode) *ClusterNode {
	c.t.Helper()
	for _, n := range c.Nodes() {
		if !n.IsPrimary() && n.PrimaryID == primary.ID {
			return n
		}
	}
	return nil
}

// node returns the fresh view of the node with id.
func (c *RedisCluster) node(id string) *ClusterNode {
	c.t.Helper()
	for _, n := range c.Nodes() {
		if n.ID == id {
			return n
		}
	}
	c.t.Fatalf("no cluster node %s", id)
	return nil
}

// WaitHealthy waits until every live (not killed, not paused) node reports
// cluster_state:ok with all 16384 slots assigned, all live nodes' CLUSTER
// NODES agree on roles, primaries and slots, and every live replica's
// master_link_status is up. It fails the test with the nodes' log tails
// after timeout.
func (c *RedisCluster) WaitHealthy(timeout time.Duration) {
	c.t.Helper()
	if err := c.waitHealthy(context.Background(), timeout, nil); err != nil {
		c.t.Fatalf("%v\n%s", err, c.logTails())
	}
}

// waitHealthy polls healthy and, if given, cond until both hold.
func (c *RedisCluster) waitHealthy(ctx context.Context, timeout time.Duration, cond func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		// cond first: views that agree, read before cond held (a promotion
		// not yet gossiped), would say nothing of the state cond awaits.
		var err error
		if cond != nil {
			err = cond(ctx)
		}
		if err == nil {
			err = c.healthy(ctx)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis cluster not healthy after %s: %w", timeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *RedisCluster) healthy(ctx context.Context) error {
	var ref, refAddr string
	for _, s := range c.servers {
		if !serverLive(s) {
			continue
		}
		info, err := c.admin(s).ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", s.Addr(), err)
		}
		if st := redisInfoField(info, "cluster_state"); st != "ok" {
			return fmt.Errorf("%s: cluster_state:%s", s.Addr(), st)
		}
		if n := redisInfoField(info, "cluster_slots_assigned"); n != "16384" {
			return fmt.Errorf("%s: cluster_slots_assigned:%s", s.Addr(), n)
		}
		if n := redisInfoField(info, "cluster_known_nodes"); n != strconv.Itoa(len(c.servers)) {
			return fmt.Errorf("%s: cluster_known_nodes:%s, want %d", s.Addr(), n, len(c.servers))
		}
		view, err := c.view(ctx, s)
		if err != nil {
			return err
		}
		sig := clusterSignature(view)
		if ref == "" {
			ref, refAddr = sig, s.Addr()
		} else if sig != ref {
			return fmt.Errorf("%s and %s disagree:\n%s\n%s", refAddr, s.Addr(), ref, sig)
		}
		for _, n := range view {
			if n.Addr == s.Addr() && !n.IsPrimary() {
				repl, err := c.admin(s).Info(ctx, "replication").Result()
				if err != nil {
					return fmt.Errorf("INFO on %s: %w", s.Addr(), err)
				}
				if st := redisInfoField(repl, "master_link_status"); st != "up" {
					return fmt.Errorf("replica %s: master_link_status:%s", s.Addr(), st)
				}
			}
		}
	}
	if ref == "" {
		return errors.New("no live cluster node")
	}
	return nil
}

// signature is what all nodes' views must agree on: each node's role,
// primary and slots.
func clusterSignature(view []*ClusterNode) string {
	lines := make([]string, 0, len(view))
	for _, n := range view {
		lines = append(lines, fmt.Sprintf("%s %s %s %s %v", n.ID, n.Addr, n.Role, n.PrimaryID, n.Slots))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func redisInfoField(info, key string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

// Failover runs CLUSTER FAILOVER on replica and waits until it is a
// primary and the cluster is healthy; it returns the promoted node.
func (c *RedisCluster) Failover(replica *ClusterNode) *ClusterNode {
	c.t.Helper()
	if err := c.admin(replica.Server).Do(context.Background(), "CLUSTER", "FAILOVER").Err(); err != nil {
		c.t.Fatalf("CLUSTER FAILOVER on %s: %v", replica.Addr, err)
	}
	err := c.waitHealthy(context.Background(), 20*time.Second, func(ctx context.Context) error {
		return c.isPrimary(ctx, replica.Server)
	})
	if err != nil {
		c.t.Fatalf("failover to %s: %v\n%s", replica.Addr, err, c.logTails())
	}
	c.reloadClients()
	return c.node(replica.ID)
}

func (c *RedisCluster) isPrimary(ctx context.Context, s *RedisServer) error {
	role, err := c.admin(s).Do(ctx, "ROLE").Slice()
	if err != nil {
		return fmt.Errorf("ROLE on %s: %w", s.Addr(), err)
	}
	if len(role) == 0 || role[0] != "master" {
		return fmt.Errorf("%s is %v, not master", s.Addr(), role)
	}
	return nil
}

// KillPrimary kills node's process with SIGKILL (any node, in fact).
func (c *RedisCluster) KillPrimary(node *ClusterNode) { node.Server.Kill() }

// WaitPromoted waits until the slots oldPrimary (a view from before it was
// killed or paused) served belong to another live primary and the live
// nodes are healthy; it returns the new primary.
func (c *RedisCluster) WaitPromoted(oldPrimary *ClusterNode, timeout time.Duration) *ClusterNode {
	c.t.Helper()
	if len(oldPrimary.Slots) == 0 {
		c.t.Fatalf("WaitPromoted: %s served no slots", oldPrimary)
	}
	slot := oldPrimary.Slots[0][0]
	var promoted *ClusterNode
	err := c.waitHealthy(context.Background(), timeout, func(ctx context.Context) error {
		ns, err := c.nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if n.IsPrimary() && n.Serves(slot) {
				if n.ID == oldPrimary.ID || n.Down {
					return fmt.Errorf("slot %d still on %s", slot, n)
				}
				promoted = n
				return nil
			}
		}
		return fmt.Errorf("no primary serves slot %d", slot)
	})
	if err != nil {
		c.t.Fatalf("no replica of %s promoted: %v\n%s", oldPrimary, err, c.logTails())
	}
	c.reloadClients()
	return promoted
}

// Restart starts a killed node again (same port, dir and node id, no data)
// and waits until the cluster is healthy; a primary that was failed over
// rejoins as a replica of its successor. It returns the node's fresh view.
func (c *RedisCluster) Restart(node *ClusterNode) *ClusterNode {
	c.t.Helper()
	node.Server.Restart()
	node.Server.WaitLoaded(20 * time.Second)
	c.WaitHealthy(20 * time.Second)
	c.reloadClients()
	return c.node(node.ID)
}

// Pause stops node's process with SIGSTOP; it keeps its sockets but
// answers nothing. Cleanup resumes it before killing it.
func (c *RedisCluster) Pause(node *ClusterNode) { c.t.Helper(); node.Server.Pause() }

// Resume continues a paused node with SIGCONT.
func (c *RedisCluster) Resume(node *ClusterNode) { c.t.Helper(); node.Server.Resume() }

// MigrateSlot moves slot, with its keys, from its primary to the primary
// to while the cluster stays online, as redis-cli --cluster reshard does,
// and waits until every live node agrees on the new owner. Safe to call
// from another goroutine.
func (c *RedisCluster) MigrateSlot(ctx context.Context, slot int, to *ClusterNode) error {
	return c.migrateSlot(ctx, slot, to, 100, 0)
}

// MigrateSlotSlowly is MigrateSlot moving 10 keys at a time and sleeping
// pause after marking the slot IMPORTING/MIGRATING, between batches and
// before handing the slot over, so that traffic meets ASK and TRYAGAIN
// while the slot is half-moved.
func (c *RedisCluster) MigrateSlotSlowly(ctx context.Context, slot int, to *ClusterNode, pause time.Duration) error {
	return c.migrateSlot(ctx, slot, to, 10, pause)
}

func (c *RedisCluster) migrateSlot(ctx context.Context, slot int, to *ClusterNode, batch int, pause time.Duration) error {
	sleep := func() error {
		if pause <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
			return nil
		}
	}
	ns, err := c.nodes(ctx)
	if err != nil {
		return err
	}
	var src, dst *ClusterNode
	for _, n := range ns {
		if n.IsPrimary() && n.Serves(slot) {
			src = n
		}
		if n.ID == to.ID {
			dst = n
		}
	}
	switch {
	case src == nil:
		return fmt.Errorf("migrate slot %d: no primary serves it", slot)
	case dst == nil || !dst.IsPrimary() || dst.Down:
		return fmt.Errorf("migrate slot %d: target %s is not a live primary", slot, to)
	case src.ID == dst.ID:
		return nil
	}
	sc, dc := c.admin(src.Server), c.admin(dst.Server)
	if err := dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.ID).Err(); err != nil {
		return fmt.Errorf("migrate slot %d: SETSLOT IMPORTING on %s: %w", slot, dst, err)
	}
	if err := sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.ID).Err(); err != nil {
		return fmt.Errorf("migrate slot %d: SETSLOT MIGRATING on %s: %w", slot, src, err)
	}
	if err := sleep(); err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(dst.Addr)
	moved := 0
	for {
		keys, err := sc.ClusterGetKeysInSlot(ctx, slot, batch).Result()
		if err != nil {
			return fmt.Errorf("migrate slot %d: GETKEYSINSLOT on %s: %w", slot, src, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000}
		if c.user != "" {
			args = append(args, "AUTH2", c.user, c.pass)
		}
		args = append(args, "KEYS")
		for _, k := range keys {
			args = append(args, k)
		}
		if err := sc.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("migrate slot %d: MIGRATE of %d keys %q from %s to %s (after %d moved; the slot is left half-moved): %w",
				slot, len(keys), keys, src, dst, moved, err)
		}
		moved += len(keys)
		if err := sleep(); err != nil {
			return err
		}
	}
	// As redis-cli does: the target first, so that it owns the slot before
	// the source stops redirecting with ASK, then the source, then the rest.
	owners := []*ClusterNode{dst, src}
	for _, n := range ns {
		if n.IsPrimary() && !n.Down && n.ID != src.ID && n.ID != dst.ID && len(n.Slots) > 0 {
			owners = append(owners, n)
		}
	}
	for _, n := range owners {
		if err := c.admin(n.Server).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.ID).Err(); err != nil {
			return fmt.Errorf("migrate slot %d: SETSLOT NODE on %s: %w", slot, n, err)
		}
	}
	err = c.waitHealthy(ctx, 20*time.Second, func(ctx context.Context) error {
		for _, s := range c.servers {
			if !serverLive(s) {
				continue
			}
			view, err := c.view(ctx, s)
			if err != nil {
				return err
			}
			for _, n := range view {
				if n.IsPrimary() && n.Serves(slot) && n.ID != dst.ID {
					return fmt.Errorf("%s still sees slot %d on %s", s.Addr(), slot, n)
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate slot %d to %s: %w", slot, dst, err)
	}
	c.reloadClients()
	return nil
}

func (c *RedisCluster) logTails() string {
	var b strings.Builder
	for _, s := range c.servers {
		fmt.Fprintf(&b, "--- %s log:\n%s\n", s.Addr(), s.LogTail(1500))
	}
	return b.String()
}

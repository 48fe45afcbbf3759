package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/redisconn"
)

// Machine describes where the bench ran, for the README and for comparing
// runs. Fields that cannot be read stay empty.
type Machine struct {
	Host         string `json:"host"`
	CPUs         int    `json:"cpus"`
	CPUModel     string `json:"cpu_model"`
	MemoryGiB    int    `json:"memory_gib"`
	Kernel       string `json:"kernel"`
	GoVersion    string `json:"go_version"`
	Redis        string `json:"redis_version"`
	RedisMode    string `json:"redis_mode"`        // single, sentinel, or cluster of N primaries
	RedisPersist string `json:"redis_persistence"` // appendonly and save settings
	RabbitMQ     string `json:"rabbitmq_version"`
	BrokerNodes  int    `json:"broker_nodes"` // URLs given to the dispatchers
}

func machineInfo(ctx context.Context, rdb redis.UniversalClient, mode redisconn.Mode, amqpURL string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), RedisMode: string(mode)}
	if mode == redisconn.Cluster {
		var mu sync.Mutex
		n := 0
		_ = redisconn.ForEachPrimary(ctx, rdb, func(context.Context, string, *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			n++
			return nil
		})
		m.RedisMode = fmt.Sprintf("cluster of %d primaries", n)
	}
	m.Host, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		for line := range strings.SplitSeq(string(b), "\n") {
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
				m.MemoryGiB = int((kb + 1<<19) >> 20)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if info, err := rdb.InfoMap(ctx, "server").Result(); err == nil {
		m.Redis = info["Server"]["redis_version"]
	}
	// CONFIG may be disabled on a managed Redis; then this stays empty. On
	// a cluster, it is one node's.
	if cfg, err := rdb.ConfigGet(ctx, "appendonly").Result(); err == nil {
		if save, err := rdb.ConfigGet(ctx, "save").Result(); err == nil {
			m.RedisPersist = fmt.Sprintf("appendonly %s, save %q", cfg["appendonly"], save["save"])
		}
	}
	urls := config.SplitAMQPURLs(amqpURL)
	m.BrokerNodes = len(urls)
	if conn, err := amqp.DialConfig(urls[0], amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)}); err == nil {
		if v, ok := conn.Properties["version"].(string); ok {
			m.RabbitMQ = v
		}
		conn.Close()
	}
	return m
}

func (m Machine) String() string {
	redisText := m.Redis
	if m.RedisMode != "" && m.RedisMode != string(redisconn.Single) {
		redisText += ", " + m.RedisMode
	}
	rabbitText := m.RabbitMQ
	if m.BrokerNodes > 1 {
		rabbitText += fmt.Sprintf(" (%d nodes)", m.BrokerNodes)
	}
	return fmt.Sprintf("%d CPUs (%s), %d GiB, Linux %s, Redis %s (%s), RabbitMQ %s, %s",
		m.CPUs, m.CPUModel, m.MemoryGiB, m.Kernel, redisText, m.RedisPersist, rabbitText, m.GoVersion)
}

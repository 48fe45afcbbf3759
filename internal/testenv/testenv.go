// Package testenv finds the Redis and RabbitMQ servers tests talk to:
// DISPATCHER_TEST_REDIS_URL and DISPATCHER_TEST_AMQP_URL if set, otherwise
// the localhost defaults, otherwise (when Docker answers) containers that
// testcontainers-go starts. Tests never mock either server.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/wait"
)

var (
	redisOnce, amqpOnce sync.Once
	redisURL, amqpURL   string
	redisErr, amqpErr   error
)

// RedisURL returns the URL of a reachable Redis, failing the test if none.
func RedisURL(t testing.TB) string {
	t.Helper()
	redisOnce.Do(func() {
		redisURL, redisErr = find("DISPATCHER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0", reachableRedis, startRedis)
	})
	if redisErr != nil {
		t.Fatalf("no Redis for tests: %v", redisErr)
	}
	return redisURL
}

// AMQPURL returns the URL of a reachable RabbitMQ, failing the test if none.
func AMQPURL(t testing.TB) string {
	t.Helper()
	amqpOnce.Do(func() {
		amqpURL, amqpErr = find("DISPATCHER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", reachableAMQP, startRabbit)
	})
	if amqpErr != nil {
		t.Fatalf("no RabbitMQ for tests: %v", amqpErr)
	}
	return amqpURL
}

func find(env, def string, reachable func(string) error, start func() (string, error)) (string, error) {
	if u := os.Getenv(env); u != "" {
		return u, reachable(u)
	}
	err := reachable(def)
	if err == nil {
		return def, nil
	}
	if !dockerAvailable() {
		return "", fmt.Errorf("%s unset, %s unreachable (%v), and no Docker to start one", env, def, err)
	}
	return start()
}

func reachableRedis(u string) error {
	opt, err := redis.ParseURL(u)
	if err != nil {
		return err
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

func reachableAMQP(u string) error {
	c, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return err
	}
	return c.Close()
}

func dockerAvailable() bool {
	if _, err := exec.LookPath("docker"); err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "docker", "info").Run() == nil
}

// Containers started here live as long as the test binary; Ryuk removes them.
func startRedis() (string, error) {
	c, err := tcredis.Run(context.Background(), "redis:7")
	if err != nil {
		return "", err
	}
	return c.ConnectionString(context.Background())
}

// The rabbitmq module of testcontainers-go lags the core module's API, so
// RabbitMQ is started as a generic container.
func startRabbit() (string, error) {
	ctx := context.Background()
	c, err := testcontainers.Run(ctx, "rabbitmq:3-management",
		testcontainers.WithExposedPorts("5672/tcp", "15672/tcp"),
		testcontainers.WithWaitStrategy(wait.ForLog("Server startup complete")))
	if err != nil {
		return "", err
	}
	ep, err := c.PortEndpoint(ctx, "5672/tcp", "")
	if err != nil {
		return "", err
	}
	return "amqp://guest:guest@" + ep + "/", nil
}

// Redis returns a client of the test Redis, closed when the test ends.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// AMQP returns a connection to the test broker, closed when the test ends.
func AMQP(t testing.TB) *amqp.Connection {
	t.Helper()
	c, err := amqp.Dial(AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Name returns a name unique to this test run: use it as key prefix,
// queue and exchange name so tests never see each other's data.
func Name(t testing.TB) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	n := strings.NewReplacer("/", "-", " ", "-", "#", "-").Replace(t.Name())
	if len(n) > 40 {
		n = n[:40]
	}
	return strings.ToLower(n) + "-" + hex.EncodeToString(b)
}

// CleanRedis deletes every key under prefix when the test ends.
func CleanRedis(t testing.TB, c *redis.Client, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
}

// Consumer binds a fresh exclusive queue to exchange with key and returns
// its deliveries. The exchange is declared durable direct if missing.
func Consumer(t testing.TB, conn *amqp.Connection, exchange, key string) <-chan amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %s: %v", exchange, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, key, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	d, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch.Close()
		if c, err := conn.Channel(); err == nil {
			c.ExchangeDelete(exchange, false, false)
			c.Close()
		}
	})
	return d
}

// HostPort returns host:port of a URL.
func HostPort(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}

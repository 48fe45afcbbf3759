package config_test

import (
	"errors"
	"testing"

	"github.com/dispatcher/dispatcher/config"
)

// LoadTool takes the commands' settings: no queue needed, the queues a
// command names count as known, a shard count is optional, and the rest
// is checked as for the daemon.
func TestLoadTool(t *testing.T) {
	clearEnv(t)
	s, err := config.LoadTool("jobs")
	if err != nil {
		t.Fatalf("nothing set: %v", err)
	}
	if q, ok := s.Queue("jobs"); !ok || q.Shards != 0 || s.RedisURL != "redis://localhost:6379/0" || s.KeyPrefix != "dq" {
		t.Errorf("defaults: %+v, queue %+v", s, q)
	}
	if _, err := config.Load(); err == nil {
		t.Error("Load with nothing set: no error")
	}

	setEnv(t, map[string]string{"DISPATCHER_QUEUE_JOBS_SHARDS": "8"})
	if s, err := config.LoadTool("jobs"); err != nil {
		t.Errorf("the named queue's SHARDS: %v", err)
	} else if q, _ := s.Queue("jobs"); q.Shards != 8 {
		t.Errorf("shards %d, want 8", q.Shards)
	}
	var e *config.Error
	if _, err := config.LoadTool("other"); !errors.As(err, &e) || e.Var != "DISPATCHER_QUEUE_JOBS_SHARDS" {
		t.Errorf("a variable of a queue not named: %v, want it unknown", err)
	}
	setEnv(t, map[string]string{"DISPATCHER_QUEUE_JOBS_SHARDS": "0"})
	if _, err := config.LoadTool("jobs"); !errors.As(err, &e) || e.Var != "DISPATCHER_QUEUE_JOBS_SHARDS" {
		t.Errorf("SHARDS=0: %v", err)
	}
	setEnv(t, map[string]string{"DISPATCHER_QUEUE_JOBS_SHARDS": "8", "DISPATCHER_LEASE": "soon"})
	if _, err := config.LoadTool("jobs"); !errors.As(err, &e) || e.Var != "DISPATCHER_LEASE" {
		t.Errorf("a bad setting: %v", err)
	}
}

package redisconn

import "context"

// Quiet is a go-redis logger (redis.SetLogger) that drops every line: for
// commands that report the error a call returns, once, where go-redis
// would first print each failed dial of its pool.
type Quiet struct{}

// Printf drops the line.
func (Quiet) Printf(context.Context, string, ...any) {}

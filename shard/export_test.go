package shard

import "time"

// UseLayout makes p use layout l as if read just now, and every write of
// p look took longer than it did (the re-check after a slow write).
func UseLayout(p *Producer, l Layout, took time.Duration) {
	p.layout.Store(&readLayout{l: l, sent: time.Now(), read: true})
	p.age = func(sent time.Time) time.Duration { return time.Since(sent) + took }
}

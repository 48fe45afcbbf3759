package main

import "testing"

func TestListenAddr(t *testing.T) {
	tests := []struct {
		addr, bind string
		loopback   bool
	}{
		{":9090", "127.0.0.1:9090", true},
		{":0", "127.0.0.1:0", true},
		{"127.0.0.1:9090", "127.0.0.1:9090", false},
		{"0.0.0.0:9090", "0.0.0.0:9090", false},
		{"[::]:9090", "[::]:9090", false},
		{"[::1]:9090", "[::1]:9090", false},
		{"10.1.2.3:9090", "10.1.2.3:9090", false},
		{"localhost:9090", "localhost:9090", false},
	}
	for _, tt := range tests {
		bind, loopback, err := listenAddr(tt.addr)
		if err != nil || bind != tt.bind || loopback != tt.loopback {
			t.Errorf("listenAddr(%q) = %q, %v, %v; want %q, %v", tt.addr, bind, loopback, err, tt.bind, tt.loopback)
		}
	}
	for _, bad := range []string{"9090", "host", "[::1", "a:b:c"} {
		if _, _, err := listenAddr(bad); err == nil {
			t.Errorf("listenAddr(%q) accepted", bad)
		}
	}
}

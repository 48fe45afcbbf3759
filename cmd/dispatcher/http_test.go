package main

import "testing"

func TestListenAddr(t *testing.T) {
	tests := []struct {
		addr, network, bind string
		loopback            bool
	}{
		{":9090", "tcp4", "127.0.0.1:9090", true},
		{":0", "tcp4", "127.0.0.1:0", true},
		{"127.0.0.1:9090", "tcp4", "127.0.0.1:9090", false},
		{"0.0.0.0:9090", "tcp4", "0.0.0.0:9090", false},
		{"10.1.2.3:9090", "tcp4", "10.1.2.3:9090", false},
		{"[::]:9090", "tcp", "[::]:9090", false},
		{"[::1]:9090", "tcp", "[::1]:9090", false},
		{"localhost:9090", "tcp", "localhost:9090", false},
	}
	for _, tt := range tests {
		network, bind, loopback, err := listenAddr(tt.addr)
		if err != nil || network != tt.network || bind != tt.bind || loopback != tt.loopback {
			t.Errorf("listenAddr(%q) = %q, %q, %v, %v; want %q, %q, %v", tt.addr, network, bind, loopback, err, tt.network, tt.bind, tt.loopback)
		}
	}
	for _, bad := range []string{"9090", "host", "[::1", "a:b:c"} {
		if _, _, _, err := listenAddr(bad); err == nil {
			t.Errorf("listenAddr(%q) accepted", bad)
		}
	}
}

// Package tlsfiles builds a TLS client configuration from PEM files named
// in settings: a CA bundle to trust and a client certificate and key.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files names the PEM files of one TLS client. All are optional; Cert and
// Key go together.
type Files struct {
	CA, Cert, Key string
}

// Empty reports whether no file is named.
func (f Files) Empty() bool { return f.CA == "" && f.Cert == "" && f.Key == "" }

// Config reads the files into a TLS client configuration: RootCAs from CA
// (the system pool when empty) and the client certificate from Cert and
// Key. Errors name the file, never its contents.
func (f Files) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate in it", f.CA)
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.Cert != "" && f.Key != "":
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			// The tls package's messages describe the PEM blocks, not their bytes.
			return nil, fmt.Errorf("client certificate %s with key %s: %w", f.Cert, f.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case f.Cert != "" || f.Key != "":
		return nil, errors.New("a client certificate and its key must be given together")
	}
	return cfg, nil
}

// Apply merges the files into base, the configuration a URL parser made for
// a TLS scheme (which sets ServerName), and returns base. A nil base gets a
// fresh configuration.
func (f Files) Apply(base *tls.Config) (*tls.Config, error) {
	cfg, err := f.Config()
	if err != nil {
		return nil, err
	}
	if base == nil {
		return cfg, nil
	}
	if cfg.RootCAs != nil {
		base.RootCAs = cfg.RootCAs
	}
	if len(cfg.Certificates) > 0 {
		base.Certificates = cfg.Certificates
	}
	if base.MinVersion < tls.VersionTLS12 {
		base.MinVersion = tls.VersionTLS12
	}
	return base, nil
}

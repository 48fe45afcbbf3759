package tlsfiles_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/internal/tlsfiles"
)

func TestConfig(t *testing.T) {
	c := testenv.NewCerts(t)
	cfg, err := tlsfiles.Files{CA: c.CA, Cert: c.ClientCert, Key: c.ClientKey}.Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootCAs == nil || len(cfg.Certificates) != 1 {
		t.Fatalf("want a CA pool and one client certificate, got %+v", cfg)
	}
}

func TestErrorsNameFilesNotContents(t *testing.T) {
	c := testenv.NewCerts(t)
	key, err := os.ReadFile(c.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		f    tlsfiles.Files
		want string
	}{
		"missing CA":    {tlsfiles.Files{CA: "/nonexistent/ca.pem"}, "/nonexistent/ca.pem"},
		"CA not PEM":    {tlsfiles.Files{CA: notPEM}, "no PEM certificate"},
		"cert only":     {tlsfiles.Files{Cert: c.ClientCert}, "together"},
		"key for cert":  {tlsfiles.Files{Cert: c.ClientKey, Key: c.ClientKey}, c.ClientKey},
		"wrong key":     {tlsfiles.Files{Cert: c.ClientCert, Key: c.ServerKey}, c.ServerKey},
		"key not found": {tlsfiles.Files{Cert: c.ClientCert, Key: "/nonexistent/key.pem"}, "/nonexistent/key.pem"},
	}
	for name, tc := range cases {
		_, err := tc.f.Config()
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not mention %q", name, err, tc.want)
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), string(key[30:60])) {
			t.Errorf("%s: error shows key material: %q", name, err)
		}
	}
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStatusTokenFile(t *testing.T) {
	for conf, want := range map[string]string{
		"":                "",
		"token_file=/a/b": "/a/b",
		"last_call_timeout=1, token_file=t,join_timeout=9": "t",
		"join_timeout=9": "",
		"token_files=x":  "",
	} {
		if got := statusTokenFile(conf); got != want {
			t.Errorf("statusTokenFile(%q) = %q, want %q", conf, got, want)
		}
	}
}

// The secret comes from token_file before $GORUN_RDZV_TOKEN; none is no
// authentication; a file others may read, or a short secret, is refused.
func TestStatusAuth(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	open := filepath.Join(dir, "open")
	os.WriteFile(good, []byte(jobSecret+"\n"), 0o600)
	os.WriteFile(open, []byte(jobSecret+"\n"), 0o644)
	env := func(v string, ok bool) func(string) (string, bool) {
		return func(string) (string, bool) { return v, ok }
	}
	for _, c := range []struct {
		conf    string
		env     func(string) (string, bool)
		auth    bool
		wantErr string
	}{
		{"", env("", false), false, ""},
		{"token_file=" + good, env("", false), true, ""},
		{"", env(jobSecret, true), true, ""},
		{"token_file=" + good, env("short", true), true, ""},
		{"", env("short", true), false, "GORUN_RDZV_TOKEN"},
		{"token_file=" + open, env("", false), false, "token_file"},
		{"token_file=" + filepath.Join(dir, "missing"), env(jobSecret, true), false, "no such file"},
	} {
		auth, err := statusAuth(c.conf, c.env)
		if (auth != nil) != c.auth || (err == nil) != (c.wantErr == "") || err != nil && !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("statusAuth(%q): auth %v, error %v; want auth %v, error with %q", c.conf, auth != nil, err, c.auth, c.wantErr)
		}
	}
}

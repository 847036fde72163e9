package launcher

import (
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"testing"
)

// What SSH resolution takes from the environment, it takes through
// SSHConfig.LookupEnv and nowhere else.
func TestSSHResolveEnvironment(t *testing.T) {
	home := t.TempDir()
	if err := os.Mkdir(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(home, ".ssh", "config"), `
Host by-var
  IdentityAgent $MY_AGENT
Host by-braces
  IdentityAgent ${MY_AGENT}
Host by-name
  IdentityAgent SSH_AUTH_SOCK
Host no-agent
  IdentityAgent none
Host by-path
  IdentityAgent ~/agent.sock
`)
	env := map[string]string{"HOME": home, "SSH_AUTH_SOCK": "/run/agent.sock", "MY_AGENT": "/run/mine.sock", "USER": "not-used"}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	d, err := newSSHDialer(SSHConfig{LookupEnv: lookup, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if d.conf == nil {
		t.Fatal("HOME's .ssh/config was not read")
	}
	if u, err := user.Current(); err == nil && d.user != u.Username {
		t.Errorf("local user %q, want the user database's %q before USER", d.user, u.Username)
	}
	for _, tc := range []struct{ host, agent string }{
		{"plain", "/run/agent.sock"},
		{"by-var", "/run/mine.sock"},
		{"by-braces", "/run/mine.sock"},
		{"by-name", "/run/agent.sock"},
		{"no-agent", ""},
		{"by-path", filepath.Join(home, "agent.sock")},
	} {
		target, err := d.resolve(tc.host, "")
		if err != nil {
			t.Errorf("%s: %v", tc.host, err)
			continue
		}
		if target.agentSocket != tc.agent {
			t.Errorf("%s: agent %q, want %q", tc.host, target.agentSocket, tc.agent)
		}
		if want := []string{filepath.Join(home, ".ssh", "known_hosts")}; !slices.Equal(target.knownHosts, want) {
			t.Errorf("%s: known hosts %v, want %v", tc.host, target.knownHosts, want)
		}
		if len(target.identities) != 3 || target.identities[0] != filepath.Join(home, ".ssh", "id_ed25519") {
			t.Errorf("%s: identities %v, want HOME's default keys", tc.host, target.identities)
		}
	}

	// No LookupEnv: no environment, so no agent; the home directory is
	// the user database's.
	d, err = newSSHDialer(SSHConfig{ConfigFile: "none", KnownHosts: filepath.Join(home, "kh"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	target, err := d.resolve("plain", "")
	if err != nil {
		t.Fatal(err)
	}
	if target.agentSocket != "" {
		t.Errorf("without LookupEnv: agent %q, want none", target.agentSocket)
	}
	if u, err := user.Current(); err == nil && d.home != u.HomeDir {
		t.Errorf("without LookupEnv: home %q, want the user database's %q", d.home, u.HomeDir)
	}
}

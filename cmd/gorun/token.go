package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/rendezvous"
)

// rdzvTokenEnv holds the job's rendezvous secret when no token file
// names it.
const rdzvTokenEnv = "GORUN_RDZV_TOKEN"

// tokenStdinFlag makes an agent read the secret from the first line of its
// stdin: the head passes it so, over the SSH session, where no argv or
// environment of any process shows it.
const tokenStdinFlag = "rdzv-token-stdin"

// nodeHostsStdinFlag makes an agent read --node-hosts from its stdin, the
// line after the secret's: the head's list of every host is too long for
// a command line at thousands of hosts.
const nodeHostsStdinFlag = "node-hosts-stdin"

// maxNodeHostsLine bounds the host list's line: 1M hosts of 16 bytes.
const maxNodeHostsLine = 16 << 20

// readNodeHosts reads the head's comma-separated host list from stdin.
func readNodeHosts(stdin *bufio.Reader) ([]string, error) {
	line, err := readLine(stdin, maxNodeHostsLine)
	if err != nil {
		return nil, fmt.Errorf("read the job's host list from stdin: %w", err)
	}
	if line == "" {
		return nil, errors.New("read the job's host list from stdin: an empty line")
	}
	return strings.Split(line, ","), nil
}

// secretSource says where an agent's secret comes from: the head's line
// on stdin first, then --rdzv-conf token_file, then $GORUN_RDZV_TOKEN;
// "" is none.
func secretSource(fromStdin bool, tokenFile string, envSet bool) string {
	switch {
	case fromStdin:
		return "stdin"
	case tokenFile != "":
		return "token_file"
	case envSet:
		return "env"
	}
	return ""
}

// rdzvSecret reads the job's rendezvous secret, if any, into spec's c10d
// settings and returns its text (for the head to pass on). The variable
// is taken out of the workers' environment: the secret is the agents'.
func rdzvSecret(c flagValues, spec *elastic.Spec, stdin io.Reader, lookupEnv func(string) (string, bool), warn func(string)) (string, error) {
	spec.Env = slices.DeleteFunc(spec.Env, func(kv string) bool { return strings.HasPrefix(kv, rdzvTokenEnv+"=") })
	envToken, envSet := lookupEnv(rdzvTokenEnv)
	var text, from string
	switch secretSource(c.Bool(tokenStdinFlag), spec.Dynamic.TokenFile, envSet) {
	case "":
		return "", nil
	case "stdin":
		line, err := readLine(stdin, 4096)
		if err != nil {
			return "", fmt.Errorf("read the rendezvous secret from stdin: %w", err)
		}
		text, from = line, "the head"
	case "token_file":
		b, err := readTokenFile(spec.Dynamic.TokenFile)
		if err != nil {
			return "", usageError{fmt.Errorf("--rdzv-conf token_file=%s: %w", spec.Dynamic.TokenFile, err)}
		}
		text, from = string(b), "--rdzv-conf token_file="+spec.Dynamic.TokenFile
	case "env":
		text, from = envToken, "$"+rdzvTokenEnv
	}
	text = strings.TrimSpace(text)
	auth, err := rendezvous.NewAuth([]byte(text))
	if err != nil {
		return "", usageError{fmt.Errorf("the rendezvous secret of %s: %w", from, err)}
	}
	if spec.Backend != "c10d" && !headMode(c) {
		if spec.MaxNodes > 1 {
			return "", usageError{fmt.Errorf("a rendezvous secret (%s) needs --rdzv-backend c10d: the static store is shared with the workers, who cannot authenticate", from)}
		}
		warn(fmt.Sprintf("the rendezvous secret of %s has no effect: a single node's static store serves this machine only", from))
		return "", nil
	}
	spec.Dynamic.Auth = auth
	return text, nil
}

// readTokenFile reads a secret that only its owner may read, as ssh
// wants of a private key: a secret others can read is no secret.
func readTokenFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("others may read it (mode %#o): chmod 600 it", perm)
	}
	return io.ReadAll(io.LimitReader(f, 4096))
}

// readLine reads up to '\n' one byte at a time, so that nothing after the
// line is taken from r: the rest of stdin is the head's EOF signal (the
// agent's own stdin is buffered once, by the caller).
func readLine(r io.Reader, max int) (string, error) {
	var line bytes.Buffer
	var b [1]byte
	for line.Len() < max {
		n, err := r.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				return line.String(), nil
			}
			line.WriteByte(b[0])
			continue
		}
		if err == io.EOF {
			return "", errors.New("stdin closed before the line's end")
		}
		if err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("no line end within %d bytes", max)
}

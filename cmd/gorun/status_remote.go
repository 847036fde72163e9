package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/rendezvous"
)

// statusSource reads the documents gorun status shows, which of them are
// of this node's agents (whose workers --stacks can reach), and those
// agents' sockets.
type statusSource func(ctx context.Context) (docs, local []elastic.NodeStatus, socks []string, err error)

// statusTokenFile takes token_file from a --rdzv-conf list: the only key
// gorun status uses; it ignores the others, so that a job's own list may
// be passed as it is.
func statusTokenFile(conf string) string {
	for kv := range strings.SplitSeq(conf, ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && k == "token_file" {
			return v
		}
	}
	return ""
}

// statusAuth is the job's secret for gorun status: --rdzv-conf token_file
// first, then $GORUN_RDZV_TOKEN, as an agent finds it; nil is none.
func statusAuth(conf string, lookupEnv func(string) (string, bool)) (*rendezvous.Auth, error) {
	var text, from string
	if path := statusTokenFile(conf); path != "" {
		b, err := readTokenFile(path)
		if err != nil {
			return nil, usageError{fmt.Errorf("--rdzv-conf token_file=%s: %w", path, err)}
		}
		text, from = string(b), "--rdzv-conf token_file="+path
	} else if v, ok := lookupEnv(rdzvTokenEnv); ok {
		text, from = v, "$"+rdzvTokenEnv
	} else {
		return nil, nil
	}
	auth, err := rendezvous.NewAuth([]byte(strings.TrimSpace(text)))
	if err != nil {
		return nil, usageError{fmt.Errorf("the rendezvous secret of %s: %w", from, err)}
	}
	return auth, nil
}

// remoteStatus connects to the job's store at endpoint and returns a
// source that reads every node's document from it, writing nothing; close
// disconnects.
func remoteStatus(ctx context.Context, endpoint, runID, conf string, lookupEnv func(string) (string, bool)) (statusSource, func(), error) {
	if runID == "" {
		return nil, nil, usageError{errors.New("status: --rdzv-endpoint needs the job's --rdzv-id")}
	}
	auth, err := statusAuth(conf, lookupEnv)
	if err != nil {
		return nil, nil, err
	}
	client, err := rendezvous.Dial(ctx, endpoint, rendezvous.ClientOptions{Timeout: 5 * time.Second, Auth: auth})
	if err != nil {
		return nil, nil, fmt.Errorf("status: %w", err)
	}
	read := func(ctx context.Context) ([]elastic.NodeStatus, []elastic.NodeStatus, []string, error) {
		docs, err := elastic.RemoteStatus(ctx, client, runID)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("status: %s: %w", endpoint, err)
		}
		if len(docs) == 0 {
			return nil, nil, nil, fmt.Errorf("status: no node of run %q has published its status at %s", runID, endpoint)
		}
		return docs, nil, nil, nil
	}
	return read, func() { client.Close() }, nil
}

// statusSourceOf picks the source of c's flags: the job's store with
// --rdzv-endpoint, else this node's agents.
func statusSourceOf(c *cli.Context, lookupEnv func(string) (string, bool)) (statusSource, func(), error) {
	id := c.String("rdzv-id")
	if ep := c.String("rdzv-endpoint"); ep != "" {
		if c.Bool("stacks") {
			return nil, nil, usageError{errors.New("status: --stacks reads this node's workers: run it without --rdzv-endpoint on their node")}
		}
		return remoteStatus(c.Context, ep, id, c.String("rdzv-conf"), lookupEnv)
	}
	dir := statusDir()
	return func(ctx context.Context) ([]elastic.NodeStatus, []elastic.NodeStatus, []string, error) {
		return readStatus(ctx, dir, id)
	}, func() {}, nil
}

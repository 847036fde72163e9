package main

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/internal/doctor"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// torchrunMasterPort is the store port torchrun uses when none is given.
const torchrunMasterPort = 29500

// doctorCommand is `gorun doctor`: a report of what a job on this node
// would meet (GPUs, NCCL and CUDA libraries, network interfaces, whether
// the store port is free, Slurm), for whoever debugs a cluster. What is
// missing is part of the report, so it exits 0 unless the report cannot be
// written or a flag is wrong.
func doctorCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "report this node's GPUs, Python and torch, NCCL and CUDA libraries, network interfaces and store port",
		Description: "Prints what a job started here would meet. Nothing is changed; a missing GPU or\n" +
			"library is reported, not an error. The store port checked is --rdzv-endpoint's, else\n" +
			"--master-port, else the Slurm step's, else torchrun's default 29500.",
		Flags: []cli.Flag{
			stringFlag("master-port", "", "store port to check (default 29500)"),
			stringFlag("rdzv-endpoint", "", "rendezvous store HOST[:PORT] whose port to check (default port 29400)"),
			stringFlag("python", "", "Python interpreter to report on (its torch, gloo and NCCL) and whose site-packages are searched for NCCL (default $PYTHON_EXEC or python3)"),
		},
		Action: func(c *cli.Context) error {
			port, err := doctorStorePort(c, os.LookupEnv)
			if err != nil {
				return usageError{err}
			}
			return doctor.Write(c.Context, stdout, doctor.Config{StorePort: port, Python: inheritedString(c, "python"), LookupEnv: os.LookupEnv, Environ: os.Environ})
		},
	}
}

// doctorStorePort picks the port a job here would host its store on, as
// the launcher does: --rdzv-endpoint, --master-port, the Slurm step, else
// torchrun's default.
func doctorStorePort(c *cli.Context, lookupEnv func(string) (string, bool)) (doctor.StorePort, error) {
	if ep := inheritedString(c, "rdzv-endpoint"); ep != "" {
		const noPort = -1 // what splitEndpoint gives for HOST alone
		host, port, err := splitEndpoint(ep, noPort)
		switch {
		case err != nil:
			return doctor.StorePort{}, err
		case port == noPort:
			// HOST alone: the c10d default port.
			return doctor.StorePort{Port: rendezvous.DefaultEndpointPort, Source: "--rdzv-endpoint " + ep + ", default port"}, nil
		case port < 1:
			return doctor.StorePort{}, fmt.Errorf("--rdzv-endpoint %q: want a port from 1 to 65535", ep)
		}
		return doctor.StorePort{Port: port, Source: "--rdzv-endpoint, store on " + host}, nil
	}
	if p := inheritedString(c, "master-port"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return doctor.StorePort{}, fmt.Errorf("--master-port %q: want a number from 1 to 65535", p)
		}
		return doctor.StorePort{Port: n, Source: "--master-port"}, nil
	}
	if step, ok, err := launcher.DetectSlurm(lookupEnv); ok && err == nil {
		return doctor.StorePort{Port: step.Port(), Source: "Slurm job " + step.JobID + ", store on " + step.Nodes[0]}, nil
	}
	return doctor.StorePort{Port: torchrunMasterPort, Source: "torchrun's default; a one-node gorun job picks a free port itself"}, nil
}

// inheritedString is the flag name as the doctor was given it, or, when
// only gorun itself was (`gorun --master-port 1234 doctor`), gorun's.
func inheritedString(c *cli.Context, name string) string {
	for _, cc := range c.Lineage() {
		if cc.IsSet(name) {
			return cc.String(name)
		}
	}
	return ""
}

package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// PythonInfo is what the interpreter gorun would run .py programs with
// says of itself and of its torch.
type PythonInfo struct {
	Executable string `json:"executable"`
	Version    string `json:"version"`
	// Torch is torch's version; empty when it does not import, and
	// TorchError says why.
	Torch      string `json:"torch"`
	TorchError string `json:"torch_error"`
	Gloo       bool   `json:"gloo"`
	NCCL       bool   `json:"nccl"`
	// NCCLVersion is the NCCL torch was built with, when it has one.
	NCCLVersion string `json:"nccl_version"`
	CUDA        string `json:"cuda"`
}

// pythonProbe prints PythonInfo as JSON; torch's import may fail, which
// is an answer, not an error.
const pythonProbe = `
import json, sys
info = {"executable": sys.executable, "version": sys.version.split()[0]}
try:
    import torch, torch.distributed as d
    info["torch"] = torch.__version__
    info["gloo"] = d.is_available() and d.is_gloo_available()
    info["nccl"] = d.is_available() and d.is_nccl_available()
    info["cuda"] = torch.version.cuda or ""
    if info["nccl"]:
        try:
            info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
except Exception as e:
    info["torch_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(info))
`

// AskPython runs python and asks it for PythonInfo, within 30 seconds:
// importing torch takes seconds.
func AskPython(ctx context.Context, python string) (PythonInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", pythonProbe).Output()
	if err != nil {
		return PythonInfo{}, err
	}
	var info PythonInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return PythonInfo{}, fmt.Errorf("doctor: %s answered %q: %w", python, strings.TrimSpace(string(out)), err)
	}
	return info, nil
}

// writePython reports the interpreter and its torch.
func writePython(ctx context.Context, r *report, python string, ask func(context.Context, string) (PythonInfo, error)) {
	r.section("Python")
	info, err := ask(ctx, python)
	if err != nil {
		r.line("%s: cannot run it: %v (name another with --python or $PYTHON_EXEC)", python, err)
		return
	}
	r.line("interpreter: %s (Python %s), from %s", info.Executable, info.Version, python)
	if info.Torch == "" {
		r.line("torch: does not import: %s (install python3-torch, or pip's torch)", info.TorchError)
		return
	}
	yes := map[bool]string{true: "yes", false: "no"}
	r.line("torch: %s", info.Torch)
	r.line("  gloo: %s", yes[info.Gloo])
	nccl := yes[info.NCCL]
	if info.NCCLVersion != "" {
		nccl += ", NCCL " + info.NCCLVersion
	}
	if info.CUDA != "" {
		nccl += ", CUDA " + info.CUDA
	}
	r.line("  nccl: %s", nccl)
}

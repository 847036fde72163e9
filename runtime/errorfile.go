package runtime

import (
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"time"

	"github.com/gorun/gorun/collective"
)

// errorFileEnv names the file in which the launcher (gorun or torchrun)
// expects a failing worker to say why, as torchelastic's @record does.
const errorFileEnv = "TORCHELASTIC_ERROR_FILE"

// RecordError writes err to the launcher's error file, in torchelastic's
// format, so that the launcher's failure report shows it; call it before
// exiting on an error. When err blames another rank (a peer that died or
// failed first), the record says so, and gorun never takes this worker for
// the root cause. Without TORCHELASTIC_ERROR_FILE it does nothing.
//
// Of opts, Init's options, only WithLookupEnv matters here: it reads the
// variable as Init would.
func RecordError(err error, opts ...Option) error {
	cfg := newConfig(opts)
	path, _ := cfg.lookupEnv(errorFileEnv)
	if err == nil || path == "" {
		return nil
	}
	var peer *collective.PeerError
	record := map[string]any{
		"message": map[string]any{
			"message": err.Error(),
			"extraInfo": map[string]string{
				"timestamp":        strconv.FormatInt(time.Now().Unix(), 10),
				"py_callstack":     "",
				"gorun_collateral": strconv.FormatBool(errors.As(err, &peer)),
			},
		},
	}
	data, jerr := json.Marshal(record)
	if jerr != nil {
		return jerr
	}
	return os.WriteFile(path, data, 0o644)
}

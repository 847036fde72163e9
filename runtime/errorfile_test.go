package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorun/gorun/collective"
)

func TestRecordErrorWritesTorchelasticFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "error.json")
	t.Setenv(errorFileEnv, path)
	for _, tc := range []struct {
		err        error
		collateral string
	}{
		{errors.New("loss is NaN"), "false"},
		{fmt.Errorf("step 3: %w", &collective.PeerError{Rank: 2, Op: "all_reduce seq 7", Err: errors.New("connection closed")}), "true"},
	} {
		if err := RecordError(tc.err); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Message struct {
				Message   string            `json:"message"`
				ExtraInfo map[string]string `json:"extraInfo"`
			} `json:"message"`
		}
		if err := json.Unmarshal(data, &file); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		if file.Message.Message != tc.err.Error() || file.Message.ExtraInfo["gorun_collateral"] != tc.collateral || file.Message.ExtraInfo["timestamp"] == "" {
			t.Errorf("RecordError(%v) wrote %s", tc.err, data)
		}
	}
}

// TestRecordErrorReadsThroughTheLookup: given WithLookupEnv, RecordError
// reads the variable there, not in the process's environment, and does
// nothing where it is unset.
func TestRecordErrorReadsThroughTheLookup(t *testing.T) {
	dir := t.TempDir()
	process, given := filepath.Join(dir, "process.json"), filepath.Join(dir, "given.json")
	t.Setenv(errorFileEnv, process)
	if err := RecordError(errors.New("boom"), withEnv(map[string]string{errorFileEnv: given})); err != nil {
		t.Fatal(err)
	}
	if err := RecordError(errors.New("boom"), withEnv(nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(given); err != nil {
		t.Errorf("the lookup's error file: %v", err)
	}
	if _, err := os.Stat(process); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the process's error file was written (stat: %v); the lookup should have been the only source", err)
	}
}

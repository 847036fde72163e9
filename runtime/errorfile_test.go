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

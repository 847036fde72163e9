package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeErrorFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "error.json")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadErrorFile(t *testing.T) {
	tests := []struct {
		name, content string
		want          ErrorInfo
	}{
		{
			"torchelastic record",
			`{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "<traceback>", "timestamp": "1795298176"}}}`,
			ErrorInfo{Message: "ValueError: boom", Traceback: "<traceback>", Timestamp: time.Unix(1795298176, 0)},
		},
		{
			"agent copy with errorCode in the message",
			`{"message": {"message": "boom", "errorCode": 3, "extraInfo": {"py_callstack": "tb", "timestamp": "5"}}}`,
			ErrorInfo{Message: "boom", Traceback: "tb", Timestamp: time.Unix(5, 0), ErrorCode: 3},
		},
		{
			"plain string message with top-level errorCode and timestamp",
			`{"message": "Signal 9", "errorCode": 137, "timestamp": 1795298176}`,
			ErrorInfo{Message: "Signal 9", Timestamp: time.Unix(1795298176, 0), ErrorCode: 137},
		},
		{"no timestamp", `{"message": "boom"}`, ErrorInfo{Message: "boom"}},
	}
	for _, tt := range tests {
		info, err := ReadErrorFile(writeErrorFile(t, tt.content))
		if err != nil || info == nil || *info != tt.want {
			t.Errorf("%s: ReadErrorFile = %+v, %v; want %+v", tt.name, info, err, tt.want)
		}
	}
}

func TestReadErrorFileMissing(t *testing.T) {
	info, err := ReadErrorFile(filepath.Join(t.TempDir(), "error.json"))
	if info != nil || err != nil {
		t.Errorf("ReadErrorFile(missing) = %+v, %v; want nil, nil", info, err)
	}
}

func TestReadErrorFileMalformed(t *testing.T) {
	for _, content := range []string{
		``,
		`{"message": `,
		`{"message": 42}`,
		`{"message": {"message": "x", "extraInfo": {"timestamp": "soon"}}}`,
	} {
		info, err := ReadErrorFile(writeErrorFile(t, content))
		if err == nil || !strings.HasPrefix(err.Error(), "launcher: parse error file ") {
			t.Errorf("ReadErrorFile(%q) = %+v, %v; want a parse error", content, info, err)
		}
	}
}

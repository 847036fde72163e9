package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"
)

// ErrorInfo is what a worker reported in its torchelastic error file
// (TORCHELASTIC_ERROR_FILE), written by torch's @record.
type ErrorInfo struct {
	Message   string    // e.g. "ValueError: boom"
	Traceback string    // Python's call stack, when recorded
	Timestamp time.Time // when the error was recorded; zero if absent
	ErrorCode int       // exit code the agent stored, 0 if absent
	// Collateral marks a failure the worker blames on another rank (gorun's
	// runtime records it when a peer died), so that it is never taken for
	// the root cause of a failure that happened at about the same time.
	Collateral bool
}

// errorFile is torchelastic's JSON. "message" is normally an object, but
// torch also accepts a plain string (with "timestamp" beside it), and the
// agent's copy carries "errorCode" inside the object.
type errorFile struct {
	Message   json.RawMessage `json:"message"`
	Timestamp json.Number     `json:"timestamp"`
	ErrorCode int             `json:"errorCode"`
}

type errorMessage struct {
	Message   string `json:"message"`
	ErrorCode int    `json:"errorCode"`
	ExtraInfo struct {
		PyCallstack string      `json:"py_callstack"`
		Timestamp   json.Number `json:"timestamp"`
		Collateral  string      `json:"gorun_collateral"`
	} `json:"extraInfo"`
}

// ReadErrorFile parses a torchelastic error file. A missing file is not an
// error: the worker recorded nothing, and ReadErrorFile returns (nil, nil).
func ReadErrorFile(path string) (*ErrorInfo, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("launcher: read error file: %w", err)
	}
	info, err := parseErrorFile(data)
	if err != nil {
		return nil, fmt.Errorf("launcher: parse error file %s: %w", path, err)
	}
	return info, nil
}

func parseErrorFile(data []byte) (*ErrorInfo, error) {
	var file errorFile
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, err
	}
	info := &ErrorInfo{ErrorCode: file.ErrorCode}
	timestamp := file.Timestamp
	var text string
	switch err := json.Unmarshal(file.Message, &text); {
	case len(file.Message) == 0:
		// no message recorded
	case err == nil:
		info.Message = text
	default:
		var msg errorMessage
		if err := json.Unmarshal(file.Message, &msg); err != nil {
			return nil, fmt.Errorf("message is neither a string nor an object: %w", err)
		}
		info.Message, info.Traceback = msg.Message, msg.ExtraInfo.PyCallstack
		info.Collateral = msg.ExtraInfo.Collateral == "true"
		timestamp = msg.ExtraInfo.Timestamp
		if msg.ErrorCode != 0 {
			info.ErrorCode = msg.ErrorCode
		}
	}
	if timestamp != "" {
		seconds, err := strconv.ParseInt(timestamp.String(), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("timestamp %q is not in seconds", timestamp)
		}
		info.Timestamp = time.Unix(seconds, 0)
	}
	return info, nil
}

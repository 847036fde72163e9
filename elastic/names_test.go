package elastic

import (
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"none", "default", "slurm-1234", "job.v2", "a b", "trainer_0", strings.Repeat("x", MaxNameLen), "é"} {
		if err := ValidateName("--rdzv-id", ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
	for _, tt := range []struct{ value, want string }{
		{"", "must not be empty"},
		{"../../x", "'/'"},
		{"..", "'..'"},
		{"a..b", "'..'"},
		{".", "'.'"},
		{"a/b", "'/'"},
		{"a\x00b", "control"},
		{"a\nb", "control"},
		{"a\x7fb", "control"},
		{"\xff", "UTF-8"},
		{strings.Repeat("x", MaxNameLen+1), "more than 128"},
	} {
		err := ValidateName("--rdzv-id", tt.value)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "--rdzv-id") {
			t.Errorf("ValidateName(%q) = %v, want an error naming --rdzv-id about %s", tt.value, err, tt.want)
		}
	}
}

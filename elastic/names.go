package elastic

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen bounds a job id or role name: the id names a folder under
// --log-dir and part of the temporary folder's name, which must stay a
// single path component well within the 255 bytes a file name may have.
const MaxNameLen = 128

// ValidateName checks a job id (--rdzv-id) or role (--role) before it
// names anything: it must be one plain path component, so that no value
// can reach outside --log-dir or the temporary folder ("../../x"), and
// printable, so that logs and error messages show it as it is. flag names
// the option in the error.
func ValidateName(flag, value string) error {
	bad := func(why string) error { return fmt.Errorf("%s %q: %s", flag, value, why) }
	switch {
	case value == "":
		return fmt.Errorf("%s must not be empty", flag)
	case len(value) > MaxNameLen:
		return fmt.Errorf("%s is %d bytes long, more than %d", flag, len(value), MaxNameLen)
	case strings.ContainsRune(value, '/'):
		return bad("must not contain '/'")
	case strings.Contains(value, ".."):
		return bad("must not contain '..'")
	case value == ".":
		return bad("must not be '.'")
	case !utf8.ValidString(value):
		return bad("is not valid UTF-8")
	case strings.IndexFunc(value, unicode.IsControl) >= 0:
		return bad("must not contain control characters")
	}
	return nil
}

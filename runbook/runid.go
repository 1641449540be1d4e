package runbook

import (
	"regexp"
	"strings"
)

var runIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidRunID reports whether id is a well-formed run ID (as results
// accepts), so it can name files safely.
func ValidRunID(id string) bool {
	return runIDPattern.MatchString(id) && !strings.Contains(id, "..")
}

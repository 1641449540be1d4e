package rule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ModeFullProxy is the only forwarding mode llmgw implements: the gateway
// terminates the client's HTTP connection and opens its own to the worker.
const ModeFullProxy Mode = "fullproxy"

// Mode is a rule's forwarding mode. On the wire it is the string "fullproxy"
// or the reference gateway's number 4 (also accepted quoted, "4"); all decode
// to ModeFullProxy, and it always encodes as "fullproxy".
//
// The zero value "" means "not set" and resolves to ModeFullProxy in
// Effective. Any other value (for instance "2" decoded from the number 2, or
// "dnat") is kept as written so that Admit can refuse it with a message that
// names it, instead of a bare type error at decode time.
type Mode string

// UnmarshalJSON accepts a JSON string or an integer. It refuses other JSON
// kinds (objects, lists, booleans, fractions).
func (m *Mode) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("rule: mode: %w", err)
		}
		if s == "4" { // a quoted YAML 4 means the same as the number
			s = string(ModeFullProxy)
		}
		*m = Mode(s)
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("rule: mode: want \"fullproxy\" or 4, got %s", truncate(string(b), 32))
	}
	if n == 4 {
		*m = ModeFullProxy
		return nil
	}
	*m = Mode(strconv.FormatInt(n, 10))
	return nil
}

// MarshalJSON writes the canonical string form.
func (m Mode) MarshalJSON() ([]byte, error) {
	return json.Marshal(string(m))
}

// Duration is a non-negative time span. On the wire it is a Go duration
// string ("5s", "250ms", "1h30m") or an integer number of seconds; it encodes
// as the shortest duration string ("5s", "1h", "1h30m"). Zero means "not set"
// wherever a default exists (see Effective). Negative values are refused at
// decode time.
type Duration time.Duration

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String returns the compact duration form used on the wire.
func (d Duration) String() string {
	s := time.Duration(d).String()
	// time.Duration.String spells whole hours and minutes as "1h0m0s" and
	// "2m0s"; trim the zero tails so read-back matches what operators write.
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// errNegativeDuration is wrapped by Duration.UnmarshalJSON for values below zero.
var errNegativeDuration = errors.New("rule: duration must not be negative")

// UnmarshalJSON accepts a duration string or an integer number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("rule: duration: %w", err)
		}
		v, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("rule: duration %q: want a duration like \"5s\" or \"250ms\", or integer seconds: %w", truncate(s, 32), err)
		}
		if v < 0 {
			return fmt.Errorf("%w: got %q", errNegativeDuration, s)
		}
		*d = Duration(v)
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("rule: duration: want a duration string like \"5s\" or integer seconds, got %s", truncate(string(b), 32))
	}
	if n < 0 {
		return fmt.Errorf("%w: got %d", errNegativeDuration, n)
	}
	if n > math.MaxInt64/int64(time.Second) {
		return fmt.Errorf("rule: duration: %d seconds is out of range", n)
	}
	*d = Duration(time.Duration(n) * time.Second)
	return nil
}

// MarshalJSON writes the compact duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}

// truncate shortens s for error messages so that a hostile body cannot blow
// up log lines.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

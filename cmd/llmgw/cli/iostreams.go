package cli

import (
	"bytes"
	"io"
	"os"

	"github.com/mattn/go-isatty"
)

// IOStreams are the standard streams a command writes to. Data goes to Out,
// progress and messages to ErrOut. Commands never touch os.Stdout directly, so
// tests can run them against buffers.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
	// OutTTY reports whether Out is a terminal: live progress and colour are
	// used only then (and never when NO_COLOR is set).
	OutTTY bool
}

// SystemIO returns the process's standard streams.
func SystemIO() *IOStreams {
	tty := isatty.IsTerminal(os.Stdout.Fd()) && os.Getenv("NO_COLOR") == ""
	return &IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr, OutTTY: tty}
}

// TestIO returns streams backed by buffers, not a TTY.
func TestIO() (*IOStreams, *bytes.Buffer, *bytes.Buffer) {
	out, errOut := &bytes.Buffer{}, &bytes.Buffer{}
	return &IOStreams{In: &bytes.Buffer{}, Out: out, ErrOut: errOut}, out, errOut
}

package cli

import (
	"bytes"
	"io"
	"os"
	"strconv"

	"github.com/charmbracelet/x/term"
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
	// Width is the terminal's width in columns when Out is one (tables are
	// sized to it); 0 means unknown or not a terminal (nothing truncated).
	Width int
}

// SystemIO returns the process's standard streams.
func SystemIO() *IOStreams {
	tty := isatty.IsTerminal(os.Stdout.Fd()) && os.Getenv("NO_COLOR") == ""
	ios := &IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr, OutTTY: tty}
	if tty {
		ios.Width = terminalWidth(os.Stdout.Fd())
	}
	return ios
}

// terminalWidth is $COLUMNS when it is a positive number (the user's
// override, as less and ls honour it), else the terminal's size, else 0.
func terminalWidth(fd uintptr) int {
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	if w, _, err := term.GetSize(fd); err == nil && w > 0 {
		return w
	}
	return 0
}

// TestIO returns streams backed by buffers, not a TTY.
func TestIO() (*IOStreams, *bytes.Buffer, *bytes.Buffer) {
	out, errOut := &bytes.Buffer{}, &bytes.Buffer{}
	return &IOStreams{In: &bytes.Buffer{}, Out: out, ErrOut: errOut}, out, errOut
}

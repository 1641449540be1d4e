package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http/httputil"
	"testing"
)

// decodeSplit feeds in to a fresh decoder in pieces of at most step bytes
// and returns the data, the bytes consumed and the error.
func decodeSplit(in []byte, step int) ([]byte, int, bool, error) {
	var c Chunked
	var out []byte
	pos := 0
	for pos < len(in) && !c.Done() {
		end := min(len(in), pos+step)
		piece := in[pos:end]
		for len(piece) > 0 && !c.Done() {
			d, n, err := c.Next(piece)
			out = append(out, d...)
			pos += n
			piece = piece[n:]
			if err != nil {
				return out, pos, false, err
			}
			if n == 0 {
				break
			}
		}
	}
	return out, pos, c.Done(), nil
}

func TestChunked(t *testing.T) {
	cases := []struct {
		name     string
		in       string
		data     string
		consumed int // -1: all of in
		done     bool
		err      bool
	}{
		{name: "one chunk", in: "5\r\nhello\r\n0\r\n\r\n", data: "hello", consumed: -1, done: true},
		{name: "two chunks, upper hex", in: "3\r\nabc\r\nA\r\n0123456789\r\n0\r\n\r\n", data: "abc0123456789", consumed: -1, done: true},
		{name: "extension", in: "3;name=value\r\nabc\r\n0;last\r\n\r\n", data: "abc", consumed: -1, done: true},
		{name: "whitespace after size", in: "3 \t\r\nabc\r\n0\r\n\r\n", data: "abc", consumed: -1, done: true},
		{name: "trailer", in: "3\r\nabc\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n", data: "abc", consumed: -1, done: true},
		{name: "stops at the end", in: "1\r\na\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n", data: "a", consumed: 11, done: true},
		{name: "incomplete", in: "5\r\nhel", data: "hel", consumed: -1},
		{name: "leading zeros", in: "0005\r\nhello\r\n0\r\n\r\n", data: "hello", consumed: -1, done: true},
		{name: "no size", in: "\r\n", err: true},
		{name: "bad size", in: "xyz\r\n", err: true},
		{name: "semicolon after whitespace", in: "3 ;x\r\nabc\r\n", err: true},
		{name: "LF without CR after size", in: "3\nabc\r\n", err: true},
		{name: "LF in extension", in: "3;a\nb\r\nabc\r\n", err: true},
		{name: "data longer than size", in: "3\r\nabcd\r\n", data: "abc", err: true},
		{name: "bare LF after data", in: "3\r\nabc\n0\r\n\r\n", data: "abc", err: true},
		{name: "size overflow", in: "1000000000000000\r\n", err: true},
		{name: "bare LF in trailer", in: "0\r\nX: 1\n\r\n", err: true},
		{name: "negative size", in: "-1\r\n", err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, step := range []int{1, 2, 3, 7, 1 << 20} {
				data, n, done, err := decodeSplit([]byte(tc.in), step)
				if (err != nil) != tc.err {
					t.Fatalf("step %d: err %v, want error %v", step, err, tc.err)
				}
				if err != nil && !errors.Is(err, ErrBrokenChunk) {
					t.Fatalf("step %d: %v is not ErrBrokenChunk", step, err)
				}
				if string(data) != tc.data {
					t.Fatalf("step %d: data %q, want %q", step, data, tc.data)
				}
				if tc.err {
					continue
				}
				want := tc.consumed
				if want < 0 {
					want = len(tc.in)
				}
				if n != want || done != tc.done {
					t.Fatalf("step %d: consumed %d done %v, want %d %v", step, n, done, want, tc.done)
				}
			}
		})
	}
}

func TestChunkLineBound(t *testing.T) {
	in := "1;" + string(bytes.Repeat([]byte("x"), MaxChunkLine)) + "\r\na\r\n"
	if _, _, _, err := decodeSplit([]byte(in), 100); !errors.Is(err, ErrBrokenChunk) {
		t.Fatalf("a %d-byte extension: %v, want ErrBrokenChunk", MaxChunkLine, err)
	}
	tr := "0\r\n" + string(bytes.Repeat([]byte("X: 1\r\n"), MaxTrailer/6+1)) + "\r\n"
	if _, _, _, err := decodeSplit([]byte(tr), 100); !errors.Is(err, ErrBrokenChunk) {
		t.Fatalf("a trailer over %d bytes: %v, want ErrBrokenChunk", MaxTrailer, err)
	}
}

func TestHeadEnd(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\nbody", 27},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r", 0},
		{"GET / HTTP/1.1\r\nHost: a\r\n", 0},
		{"GET / HTTP/1.1\nHost: a\n\nbody", 24},
		{"GET / HTTP/1.1\r\nHost: a\n\r\n", 26},
		{"", 0},
		{"\r\n\r\n", 4},
		{"GET / HTTP/1.1\r\n", 0},
	}
	for _, tc := range cases {
		if got := HeadEnd([]byte(tc.in)); got != tc.want {
			t.Errorf("HeadEnd(%q) = %d, want %d", tc.in, got, tc.want)
		}
		if got := headEndModel([]byte(tc.in)); got != tc.want {
			t.Errorf("model(%q) = %d, want %d (the test's model is wrong)", tc.in, got, tc.want)
		}
	}
}

// headEndModel is HeadEnd by its definition: the earliest LF LF or LF CR
// LF, counted to its end.
func headEndModel(b []byte) int {
	best := 0
	if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
		best = i + 2
	}
	if i := bytes.Index(b, []byte("\n\r\n")); i >= 0 && (best == 0 || i+3 < best) {
		best = i + 3
	}
	return best
}

func FuzzHeadEnd(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte("a\n\n"))
	f.Add([]byte("\n\r\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := HeadEnd(b), headEndModel(b); got != want {
			t.Fatalf("HeadEnd(%q) = %d, model %d", b, got, want)
		}
	})
}

// FuzzChunked checks the decoder on arbitrary bytes: whatever the pieces
// it is fed in, it decodes the same; and a body it accepts as whole is
// one net/http's chunked reader (more lenient: it takes bare LF) reads to
// the same data.
func FuzzChunked(f *testing.F) {
	for _, s := range []string{"5\r\nhello\r\n0\r\n\r\n", "3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n", "1\r\na\r\n", "0\r\n\r\nrest", "A \r\n0123456789\r\n0\r\n\r\n"} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		whole, n, done, err := decodeSplit(in, len(in)+1)
		split, n2, done2, err2 := decodeSplit(in, int(step)+1)
		if (err == nil) != (err2 == nil) || !bytes.Equal(whole, split) || done != done2 || (err == nil && n != n2) {
			t.Fatalf("whole: %q %d %v %v; in pieces of %d: %q %d %v %v", whole, n, done, err, int(step)+1, split, n2, done2, err2)
		}
		if n > len(in) {
			t.Fatalf("consumed %d of %d bytes", n, len(in))
		}
		if err != nil || !done {
			return
		}
		ref, rerr := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(bytes.NewReader(in[:n]))))
		if rerr != nil {
			// net/http limits what this decoder allows elsewhere (its
			// line length): only a disagreement on data matters.
			var lineErr = rerr.Error()
			if lineErr == "header line too long" {
				return
			}
			t.Fatalf("accepted %q (data %q), net/http: %v", in[:n], whole, rerr)
		}
		if !bytes.Equal(ref, whole) {
			t.Fatalf("%q: data %q, net/http %q", in[:n], whole, ref)
		}
	})
}

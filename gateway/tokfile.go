package gateway

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/llmgw/llmgw/gateway/rule"
)

// maxTokenizerFileBytes bounds a kvTokenizer file. The largest tokenizer.json
// files of current models are tens of megabytes (Qwen3's is about 11 MB);
// the bound keeps one rule from making the gateway read an arbitrary file
// into memory.
const maxTokenizerFileBytes = 256 << 20

// checkTokenizerPath vets a kvTokenizer that names a path before the admin
// lock is taken: it must be a regular file of at most maxTokenizerFileBytes
// (a .gguf of any size), or a directory, which the tokenizer resolves
// inside. A FIFO or a device
// is refused: reading one can block for ever, and with the rule's tokenizer
// loaded under the admin lock it used to stall the whole management API. The
// open is non-blocking (a FIFO's open would otherwise wait for a writer),
// and the checks run on the opened file, so a path swapped after the check
// is not trusted either.
func checkTokenizerPath(path string) error {
	switch path {
	case "", "builtin", "engine":
		return nil
	}
	return checkSideFile(path, rule.CodeKVTokenizer, "kvTokenizer", true, maxTokenizerFileBytes)
}

// maxChatTemplateFileBytes bounds a kvChatTemplate file (templates are
// kilobytes).
const maxChatTemplateFileBytes = 1 << 20

// checkTemplatePath vets a kvChatTemplate as checkTokenizerPath does a
// kvTokenizer: a bounded regular file, opened without blocking.
func checkTemplatePath(path string) error {
	if path == "" {
		return nil
	}
	return checkSideFile(path, rule.CodeKVChatTemplate, "kvChatTemplate", false, maxChatTemplateFileBytes)
}

func checkSideFile(path, code, field string, dirOK bool, limit int64) error {
	bad := func(format string, a ...any) error {
		return &rule.AdmissionError{Code: code, Field: field, Message: fmt.Sprintf(format, a...)}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return bad("%s %q cannot be opened: %v", field, path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return bad("%s %q: %v", field, path, err)
	}
	switch {
	case st.IsDir() && dirOK:
		return nil
	case !st.Mode().IsRegular():
		return bad("%s %q is a %s, not a regular file", field, path, fileKind(st.Mode()))
	case st.Size() > limit && !(dirOK && strings.HasSuffix(strings.ToLower(path), ".gguf")):
		// A .gguf model file (gigabytes) is read for its metadata header
		// only, where the tokenizer's vocabulary lives; other files are
		// read whole.
		return bad("%s %q is %d bytes; the limit is %d", field, path, st.Size(), limit)
	}
	return nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0, m&os.ModeCharDevice != 0:
		return "device"
	case m&os.ModeSymlink != 0:
		return "symbolic link"
	}
	return "special file"
}

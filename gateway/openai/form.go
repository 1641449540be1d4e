package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"strings"
)

// maxFormValue bounds the model and stream values read from a form: a
// model name longer than this is refused rather than buffered.
const maxFormValue = 256

// Form is what the gateway reads from a multipart/form-data body (the
// audio routes): the "model" and "stream" fields.
type Form struct {
	// Model is the "model" field; nil when the form has none (engines take
	// their served model then: vLLM's transcription request has
	// model: str | None = None).
	Model  []byte
	Stream bool
}

// ParseForm reads the "model" and "stream" fields of a multipart/form-data
// body whose Content-Type header is contentType. body is the whole request
// body (already bounded by the listener's body limit); parts are scanned in
// place and only the two small values are copied, so an audio file is never
// buffered a second time. Every part is visited so that a repeated "model"
// or "stream" is refused like a duplicate JSON field (an engine's form
// parser may keep the other one).
func ParseForm(contentType, body []byte) (Form, error) {
	var f Form
	mt, params, err := mime.ParseMediaType(string(contentType))
	if err != nil || mt != "multipart/form-data" {
		return f, fmt.Errorf("%w: this route takes a multipart/form-data body, not %q", ErrInvalid, contentType)
	}
	boundary := params["boundary"]
	if boundary == "" {
		return f, fmt.Errorf("%w: multipart/form-data without a boundary", ErrInvalid)
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	var seenModel, seenStream bool
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return f, nil
		}
		if err != nil {
			return Form{}, fmt.Errorf("%w: malformed multipart body: %v", ErrInvalid, err)
		}
		switch p.FormName() {
		case "model":
			if seenModel {
				return Form{}, dupError("model")
			}
			seenModel = true
			v, err := readFormValue(p, "model")
			if err != nil {
				return Form{}, err
			}
			f.Model = v
		case "stream":
			if seenStream {
				return Form{}, dupError("stream")
			}
			seenStream = true
			v, err := readFormValue(p, "stream")
			if err != nil {
				return Form{}, err
			}
			b, ok := formBool(string(v))
			if !ok {
				return Form{}, fmt.Errorf("%w: form field \"stream\" must be a boolean, not %q", ErrInvalid, v)
			}
			f.Stream = b
		}
	}
}

func readFormValue(p *multipart.Part, name string) ([]byte, error) {
	v, err := io.ReadAll(io.LimitReader(p, maxFormValue+1))
	if err != nil {
		return nil, fmt.Errorf("%w: malformed multipart body: form field %q: %v", ErrInvalid, name, err)
	}
	if len(v) > maxFormValue {
		return nil, fmt.Errorf("%w: form field %q is longer than %d bytes", ErrInvalid, name, maxFormValue)
	}
	return v, nil
}

// formBool parses a form boolean the way the Python engines' form models do
// (pydantic's lax bool: true/false, 1/0, yes/no, on/off, t/f, y/n, any case).
func formBool(s string) (bool, bool) {
	switch strings.ToLower(s) {
	case "true", "1", "yes", "on", "t", "y":
		return true, true
	case "false", "0", "no", "off", "f", "n":
		return false, true
	}
	return false, false
}

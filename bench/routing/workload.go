package routing

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/llmgw/llmgw/engines/tokenizer"
)

// ErrParams classifies invalid workload or run parameters; test with
// errors.Is. Run returns it before any simulator starts.
var ErrParams = errors.New("routing: invalid parameters")

// Workload names a request mix.
type Workload string

// The workloads. Each stresses a different reason for prefix reuse; Random
// has none and is the control.
const (
	// SharedPrefix: a few long system prompts, each shared by many users
	// asking short unique questions.
	SharedPrefix Workload = "shared-prefix"
	// MultiTurn: conversations whose context grows turn by turn; each
	// conversation's turns are sent in order, one after the other.
	MultiTurn Workload = "multi-turn"
	// LongDoc: question answering over a few long documents, several
	// questions per document, in shuffled order.
	LongDoc Workload = "long-doc"
	// HotPrefix: shared system prompts whose popularity is Zipf-skewed, so
	// one prefix carries most of the traffic (a load-balancing trap).
	HotPrefix Workload = "hot-prefix"
	// Random: unique prompts with nothing in common (the control).
	Random Workload = "random"
)

// Workloads lists every workload in report order.
func Workloads() []Workload {
	return []Workload{SharedPrefix, MultiTurn, LongDoc, HotPrefix, Random}
}

// ParseWorkload returns the workload named s, or an error wrapping
// ErrParams that lists the valid names.
func ParseWorkload(s string) (Workload, error) {
	for _, w := range Workloads() {
		if string(w) == s {
			return w, nil
		}
	}
	names := make([]string, 0, 5)
	for _, w := range Workloads() {
		names = append(names, string(w))
	}
	return "", fmt.Errorf("%w: unknown workload %q; valid workloads are %s", ErrParams, s, strings.Join(names, ", "))
}

// Request is one chat request of a workload.
type Request struct {
	Messages []tokenizer.Message
}

// Session is a sequence of requests that must be sent in order, each after
// the previous one completed (a conversation); a one-request session is an
// independent request.
type Session []Request

// Shape sizes a workload. Sizes are in words of generated text (the
// vocabulary words are mostly one Qwen3 token each).
type Shape struct {
	// Requests is the total number of requests (≥ 1).
	Requests int
	// Prefixes is the number of distinct shared prefixes: system prompts for
	// SharedPrefix and HotPrefix, documents for LongDoc, conversations for
	// MultiTurn; ignored by Random.
	Prefixes int
	// PrefixWords is the length of each shared prefix (system prompt or
	// document), or of each conversation's opening message.
	PrefixWords int
	// SuffixWords is the length of each unique part: a user question, a new
	// chat turn, or a whole Random prompt's extra text.
	SuffixWords int
}

// DefaultShape returns the shape Run uses for w at the given request
// count.
func DefaultShape(w Workload, requests int) Shape {
	s := Shape{Requests: requests, Prefixes: 16, PrefixWords: 300, SuffixWords: 30}
	switch w {
	case MultiTurn:
		s.Prefixes, s.PrefixWords, s.SuffixWords = max(requests/8, 1), 120, 40
	case LongDoc:
		s.Prefixes, s.PrefixWords, s.SuffixWords = 5, 800, 20
	case Random:
		s.PrefixWords = 300
	}
	return s
}

// Validate reports a shape Generate cannot honour, wrapping ErrParams.
func (s Shape) Validate() error {
	switch {
	case s.Requests < 1:
		return fmt.Errorf("%w: requests must be at least 1, got %d", ErrParams, s.Requests)
	case s.Requests > 1_000_000:
		return fmt.Errorf("%w: requests %d above the 1000000 limit", ErrParams, s.Requests)
	case s.Prefixes < 1:
		return fmt.Errorf("%w: prefixes must be at least 1, got %d", ErrParams, s.Prefixes)
	case s.PrefixWords < 1 || s.SuffixWords < 1:
		return fmt.Errorf("%w: prefix and suffix words must be at least 1, got %d and %d", ErrParams, s.PrefixWords, s.SuffixWords)
	case s.PrefixWords+s.SuffixWords > 8000:
		// The simulators' context is 40960 tokens; a multi-turn history
		// grows by turns, so keep single parts far below it.
		return fmt.Errorf("%w: prefix + suffix words %d above the 8000 limit", ErrParams, s.PrefixWords+s.SuffixWords)
	}
	return nil
}

// Generate returns w's sessions for shape, a pure function of its
// arguments: equal seeds give byte-identical workloads.
func Generate(w Workload, shape Shape, seed uint64) ([]Session, error) {
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	g := &gen{rng: rand.New(rand.NewPCG(seed, 0x6c6c6d6777))}
	switch w {
	case SharedPrefix:
		return g.shared(shape, nil), nil
	case HotPrefix:
		return g.shared(shape, rand.NewZipf(g.rng, 1.3, 1, uint64(shape.Prefixes-1))), nil
	case MultiTurn:
		return g.multiTurn(shape), nil
	case LongDoc:
		return g.longDoc(shape), nil
	case Random:
		return g.random(shape), nil
	}
	_, err := ParseWorkload(string(w))
	return nil, err
}

type gen struct {
	rng *rand.Rand
	seq int
}

// vocabulary for generated text: ordinary words, so the tokenizer splits
// them as it would real prose.
var vocabulary = strings.Fields(`the of and to in is that for it as with was on be by at this
from or have an they which one you were all we when there can been has more if will would
who so no out up into than them only other time new some could these two may first then do
any like my now over such our man me even most made after also did many before must through
back years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both life being
under never day same another know while last might us great old year off come since against go
came right used take three gateway routing cache prefix worker token latency engine block
model request answer question document system prompt user assistant context memory`)

func (g *gen) words(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[g.rng.IntN(len(vocabulary))])
	}
	return b.String()
}

// unique returns n words starting with a marker no other text of the run
// has, so the text cannot share a block with anything generated before.
func (g *gen) unique(n int) string {
	g.seq++
	return fmt.Sprintf("#%d %s", g.seq, g.words(max(n-1, 1)))
}

func (g *gen) shared(s Shape, zipf *rand.Zipf) []Session {
	systems := make([]string, s.Prefixes)
	for i := range systems {
		systems[i] = fmt.Sprintf("You are assistant %d. %s", i, g.words(s.PrefixWords))
	}
	out := make([]Session, s.Requests)
	for i := range out {
		p := g.rng.IntN(s.Prefixes)
		if zipf != nil {
			p = int(zipf.Uint64())
		}
		out[i] = Session{{Messages: []tokenizer.Message{
			{Role: "system", Content: systems[p]},
			{Role: "user", Content: g.unique(s.SuffixWords)},
		}}}
	}
	return out
}

// multiTurn deals the requests over s.Prefixes conversations; turn k of a
// conversation resends the whole history (with a synthetic assistant
// answer per earlier turn) plus a new user message.
func (g *gen) multiTurn(s Shape) []Session {
	convs := min(s.Prefixes, s.Requests)
	out := make([]Session, convs)
	for c := range out {
		turns := s.Requests / convs
		if c < s.Requests%convs {
			turns++
		}
		msgs := []tokenizer.Message{{Role: "system", Content: "You are a helpful assistant."},
			{Role: "user", Content: g.unique(s.PrefixWords)}}
		for t := 0; t < turns; t++ {
			out[c] = append(out[c], Request{Messages: append([]tokenizer.Message(nil), msgs...)})
			msgs = append(msgs, tokenizer.Message{Role: "assistant", Content: g.words(s.SuffixWords / 2)},
				tokenizer.Message{Role: "user", Content: g.unique(s.SuffixWords)})
		}
	}
	// Interleave the conversations' start order, as users arrive at random.
	g.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func (g *gen) longDoc(s Shape) []Session {
	docs := make([]string, s.Prefixes)
	for i := range docs {
		docs[i] = fmt.Sprintf("Document %d.\n%s", i, g.words(s.PrefixWords))
	}
	out := make([]Session, s.Requests)
	for i := range out {
		d := i % s.Prefixes
		out[i] = Session{{Messages: []tokenizer.Message{
			{Role: "system", Content: "Answer from the document only."},
			{Role: "user", Content: docs[d] + "\n\nQuestion: " + g.unique(s.SuffixWords)},
		}}}
	}
	g.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func (g *gen) random(s Shape) []Session {
	out := make([]Session, s.Requests)
	for i := range out {
		// The unique marker leads the system message, so not even the
		// template's opening block is shared beyond its first tokens.
		out[i] = Session{{Messages: []tokenizer.Message{
			{Role: "system", Content: g.unique(s.PrefixWords)},
			{Role: "user", Content: g.words(s.SuffixWords)},
		}}}
	}
	return out
}

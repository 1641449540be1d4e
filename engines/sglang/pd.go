package sglang

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/engines"
)

// pd is SGLang's concurrent hand-off: the same body, carrying the prefill's
// bootstrap address and a fresh room, goes to the prefill and the decode at
// once; the decode joins the prefill's room and pulls the KV, and answers
// the client. Fields: bootstrap_host, bootstrap_port, bootstrap_room on the
// request (python/sglang/srt/entrypoints/openai/protocol.py,
// CompletionRequest/ChatCompletionRequest; the mini load balancer
// python/sglang/srt/disaggregation/mini_lb.py fills them the same way).
type pd struct{}

// DefaultBootstrapPort is SGLang's --disaggregation-bootstrap-port default
// (python/sglang/srt/server_args.py: disaggregation_bootstrap_port = 8998).
const DefaultBootstrapPort = 8998

// The request fields of the hand-off (all top level).
const (
	FieldHost = "bootstrap_host"
	FieldPort = "bootstrap_port"
	FieldRoom = "bootstrap_room"
)

const (
	fieldHost = FieldHost
	fieldPort = FieldPort
	fieldRoom = FieldRoom
)

// ServerInfoBootstrapPort is the /get_server_info key that reports a
// prefill server's bootstrap port (ServerArgs.disaggregation_bootstrap_port,
// served as part of the server args).
const ServerInfoBootstrapPort = "disaggregation_" + fieldPort

// Fields are the request fields of the hand-off (all top level).
var Fields = []string{fieldHost, fieldPort, fieldRoom}

func (pd) Shape() engines.PDShape { return engines.PDConcurrent }
func (pd) BootstrapPort() int     { return DefaultBootstrapPort }
func (pd) KVPorts() bool          { return false }

func (pd) LegRequestID(p *engines.PDPair) string { return p.RequestID }

// bracketHost writes an IPv6 literal in brackets, as SGLang expects.
func bracketHost(h string) string {
	if strings.Contains(h, ":") && !strings.HasPrefix(h, "[") {
		return "[" + h + "]"
	}
	return h
}

// legBody is both legs' body: the client's plus the triple.
func legBody(body []byte, p *engines.PDPair) ([]byte, error) {
	port := p.BootstrapPort
	if port == 0 {
		port = DefaultBootstrapPort
	}
	return engines.RewriteJSON(body, func(v *fastjson.Value, a *fastjson.Arena) {
		v.Set(fieldHost, a.NewString(bracketHost(p.PrefillHost)))
		v.Set(fieldPort, a.NewNumberInt(port))
		v.Set(fieldRoom, a.NewNumberString(strconv.FormatUint(p.Nonce&(1<<63-1), 10)))
	})
}

func (pd) PrefillBody(body []byte, p *engines.PDPair) ([]byte, error) { return legBody(body, p) }

// HandOff: the KV moves through the bootstrap room, never through the
// gateway.
func (pd) HandOff([]byte, *engines.PDPair) engines.HandOff {
	return engines.HandOff{OutOfBand: true}
}

func (pd) DecodeBody(body []byte, p *engines.PDPair, _ engines.HandOff) ([]byte, error) {
	return legBody(body, p)
}

// ParseLeg reads the triple. bootstrap_host and bootstrap_room go together;
// bootstrap_port may be null (SGLang then uses its default 8998); the room
// is an integer in [0, 2^63).
func (pd) ParseLeg(body []byte) (engines.PDLeg, error) {
	var req struct {
		Host json.RawMessage `json:"bootstrap_host"`
		Port json.RawMessage `json:"bootstrap_port"`
		Room json.RawMessage `json:"bootstrap_room"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return engines.PDLeg{}, engines.PDErrorf("%v", err)
	}
	if engines.IsJSONNull(req.Host) && engines.IsJSONNull(req.Room) && engines.IsJSONNull(req.Port) {
		return engines.PDLeg{}, nil
	}
	if engines.IsJSONNull(req.Host) || engines.IsJSONNull(req.Room) {
		return engines.PDLeg{}, engines.PDErrorf("%s and %s must be given together", fieldHost, fieldRoom)
	}
	t := engines.Rendezvous{Port: DefaultBootstrapPort}
	if err := json.Unmarshal(req.Host, &t.Host); err != nil {
		return engines.PDLeg{}, engines.PDErrorf("%s: expected a string", fieldHost)
	}
	if !engines.IsJSONNull(req.Port) {
		if err := json.Unmarshal(req.Port, &t.Port); err != nil {
			return engines.PDLeg{}, engines.PDErrorf("%s: expected an integer", fieldPort)
		}
	}
	var room json.Number
	if err := json.Unmarshal(req.Room, &room); err != nil {
		return engines.PDLeg{}, engines.PDErrorf("%s: expected an integer", fieldRoom)
	}
	r, err := strconv.ParseUint(room.String(), 10, 64)
	if err != nil || r > math.MaxInt64 {
		return engines.PDLeg{}, engines.PDErrorf("%s %s out of range [0, 2^63)", fieldRoom, room)
	}
	t.Room = r
	return engines.PDLeg{Role: engines.PDLegRendezvous, RemoteBlocks: -1, RemoteTokens: -1, Rendezvous: &t}, nil
}

func (pd) ParseLegAnswer([]byte) []byte { return nil }

// ParseHandOff: the concurrent shape carries no hand-off object.
func (pd) ParseHandOff([]byte) (engines.PDLeg, error) { return engines.PDLeg{}, nil }

// CarryParams: nothing is carried.
func (pd) CarryParams([]byte) []byte { return nil }

// Summary is the P/D runbook's evidence phrase.
func (pd) Summary() string {
	return "the same bootstrap triple (room) on both legs, at the chosen prefill's bootstrap port"
}

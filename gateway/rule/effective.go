package rule

import (
	"net"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/engines"
)

// Defaults resolved by Effective. They are exported so that the gateway's
// runtime and documentation quote one source.
const (
	DefaultKVBlockSize   = 16
	DefaultKVZmqPort     = 5557
	DefaultKVDpRankCount = 1
	DefaultKVHashSeed    = "0"
	DefaultKVEngineType  = string(engines.VLLM)
	// DefaultKVHitMinShare: a KV-exact decision is a hit when the chosen
	// endpoint holds at least half of the prompt's full blocks. One block
	// of a shared system preamble is not a hit.
	DefaultKVHitMinShare = 0.5

	DefaultCBFailures       = 5
	DefaultCBFailuresPD     = 3
	DefaultCBOpenFor        = 30 * time.Second
	DefaultCBHalfOpenTrials = 3
	DefaultCBOrigin5xx      = 3

	DefaultCHWBLLoadFactor  = 1.25
	DefaultCHWBLReplicas    = 160
	DefaultCHWBLPrefixBytes = 2048

	DefaultProbePath      = "/health"
	DefaultProbeInterval  = 5 * time.Second
	DefaultProbeTimeout   = 2 * time.Second
	DefaultProbeFailures  = 2
	DefaultProbeSuccesses = 1

	DefaultConnectTimeout   = 2 * time.Second
	DefaultFirstByteTimeout = 60 * time.Second
	DefaultIdleTimeout      = 120 * time.Second
	DefaultPrefillTimeout   = 30 * time.Second

	DefaultSessionTTL = time.Hour
	DefaultWeight     = 1
)

// DefaultHashAlgo returns the block-hash algorithm an engine uses when the
// rule does not name one: its adapter's KV().HashAlgo ("" means the default
// engine). It returns "" for engines without a KV event plane (llama.cpp)
// and for unknown engines.
func DefaultHashAlgo(engine string) string {
	a := adapterFor(engine)
	if a == nil || a.KV() == nil {
		return ""
	}
	return a.KV().HashAlgo
}

// EndpointID returns the default id of an endpoint: "<endpointIP>:<targetPort>"
// (IPv6 addresses in brackets).
func EndpointID(ip string, port int) string {
	return net.JoinHostPort(ip, strconv.Itoa(port))
}

// Clone returns a deep copy of r; nil yields nil. Mutating the copy never
// affects r.
func (r *Rule) Clone() *Rule {
	if r == nil {
		return nil
	}
	c := *r
	if r.KVHashSeed != nil {
		s := *r.KVHashSeed
		c.KVHashSeed = &s
	}
	if r.CBEnable != nil {
		b := *r.CBEnable
		c.CBEnable = &b
	}
	if r.KVHitMinShare != nil {
		v := *r.KVHitMinShare
		c.KVHitMinShare = &v
	}
	if r.BackendTLS != nil {
		t := *r.BackendTLS
		c.BackendTLS = &t
	}
	if r.EndpointsFrom != nil {
		f := *r.EndpointsFrom
		f.Selector = nil // an empty selector reads back as absent
		if len(r.EndpointsFrom.Selector) > 0 {
			f.Selector = make(map[string]string, len(r.EndpointsFrom.Selector))
			for k, v := range r.EndpointsFrom.Selector {
				f.Selector[k] = v
			}
		}
		f.TargetPorts = append([]int(nil), f.TargetPorts...)
		c.EndpointsFrom = &f
	}
	if r.Endpoints != nil {
		c.Endpoints = make([]Endpoint, len(r.Endpoints))
		for i, ep := range r.Endpoints {
			if ep.Weight != nil {
				w := *ep.Weight
				ep.Weight = &w
			}
			c.Endpoints[i] = ep
		}
	}
	return &c
}

// Effective returns a deep copy of r with every default resolved; r is not
// modified and nil yields nil. Only zero (unset) values are replaced, so
// Effective is idempotent: r.Effective().Effective() equals r.Effective().
// The result of an admitted rule is itself admitted, so a read-back can be
// applied again unchanged. Effective only reads r; concurrent calls on one
// rule are safe as long as nobody writes to it.
//
// Defaults that only make sense for one engine or topology are resolved only
// there: pdBootstrapPort for P/D rules of engines with a bootstrap port
// (SGLang), kvHashAlgo for engines with a
// KV event plane, 3 breaker failures (instead of 5) on P/D rules.
func (r *Rule) Effective() *Rule {
	if r == nil {
		return nil
	}
	e := r.Clone()
	if e.Mode == "" {
		e.Mode = ModeFullProxy
	}
	e.SelName, e.KVExactModeName = e.Sel.Name(), e.KVExactMode.Name()
	if e.KVEngineType == "" {
		e.KVEngineType = DefaultKVEngineType
	}
	if e.KVHashAlgo == "" {
		e.KVHashAlgo = DefaultHashAlgo(e.KVEngineType)
	}
	if e.KVHashSeed == nil {
		s := DefaultKVHashSeed
		e.KVHashSeed = &s
	}
	if e.KVBlockSize == 0 {
		e.KVBlockSize = DefaultKVBlockSize
	}
	if e.KVZmqPort == 0 {
		e.KVZmqPort = DefaultKVZmqPort
	}
	if e.KVDpRankCount == 0 {
		e.KVDpRankCount = DefaultKVDpRankCount
	}
	if e.KVHitMinShare == nil && (e.KVExactMode == 1 || e.KVExactMode == 3) {
		v := DefaultKVHitMinShare
		e.KVHitMinShare = &v
	}
	if e.PDBootstrapPort == 0 && e.PDDisaggMode {
		if a := adapterOf(e); a != nil && a.PD() != nil {
			e.PDBootstrapPort = a.PD().BootstrapPort() // 0 for engines without one
		}
	}
	if e.SessionTTL == 0 {
		e.SessionTTL = Duration(DefaultSessionTTL)
	}

	if e.CBEnable == nil {
		on := true
		e.CBEnable = &on
	}
	if e.CB.Failures == 0 {
		e.CB.Failures = DefaultCBFailures
		if e.PDDisaggMode {
			e.CB.Failures = DefaultCBFailuresPD
		}
	}
	if e.CB.OpenFor == 0 {
		e.CB.OpenFor = Duration(DefaultCBOpenFor)
	}
	if e.CB.HalfOpenTrials == 0 {
		e.CB.HalfOpenTrials = DefaultCBHalfOpenTrials
	}
	if e.CB.Origin5xx == 0 {
		e.CB.Origin5xx = DefaultCBOrigin5xx
	}

	if e.CHWBL.LoadFactor == 0 {
		e.CHWBL.LoadFactor = DefaultCHWBLLoadFactor
	}
	if e.CHWBL.Replicas == 0 {
		e.CHWBL.Replicas = DefaultCHWBLReplicas
	}
	if e.CHWBL.PrefixBytes == 0 {
		e.CHWBL.PrefixBytes = DefaultCHWBLPrefixBytes
	}

	if e.Probe.Path == "" {
		e.Probe.Path = DefaultProbePath
	}
	if e.Probe.Interval == 0 {
		e.Probe.Interval = Duration(DefaultProbeInterval)
	}
	if e.Probe.Timeout == 0 {
		e.Probe.Timeout = Duration(min(DefaultProbeTimeout, e.Probe.Interval.Std()))
	}
	if e.Probe.Failures == 0 {
		e.Probe.Failures = DefaultProbeFailures
	}
	if e.Probe.Successes == 0 {
		e.Probe.Successes = DefaultProbeSuccesses
	}

	if e.Timeouts.Connect == 0 {
		e.Timeouts.Connect = Duration(DefaultConnectTimeout)
	}
	if e.Timeouts.FirstByte == 0 {
		e.Timeouts.FirstByte = Duration(DefaultFirstByteTimeout)
	}
	if e.Timeouts.Idle == 0 {
		e.Timeouts.Idle = Duration(DefaultIdleTimeout)
	}
	if e.Timeouts.Prefill == 0 {
		e.Timeouts.Prefill = Duration(DefaultPrefillTimeout)
	}

	for i := range e.Endpoints {
		ep := &e.Endpoints[i]
		ep.EPRoleName = ep.EPRole.Name()
		if ep.ID == "" {
			ep.ID = EndpointID(ep.EndpointIP, ep.TargetPort)
		}
		if ep.Weight == nil {
			w := DefaultWeight
			ep.Weight = &w
		}
	}
	return e
}

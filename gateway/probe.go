package gateway

import (
	"context"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// probeLoop actively checks one endpoint until ctx ends: GET probe.path
// every interval; the endpoint is marked down after `failures` consecutive
// failures and up again after `successes` consecutive successes. The first
// probe runs at once, so a dead worker is found within one timeout of start.
func (s *Server) probeLoop(ctx context.Context, rt *ruleRuntime, ep *upstream.Endpoint) {
	p := rt.rule.Probe
	client := &fasthttp.HostClient{
		Addr:                      ep.Addr,
		MaxConns:                  1,
		ReadTimeout:               p.Timeout.Std(),
		WriteTimeout:              p.Timeout.Std(),
		MaxIdemponentCallAttempts: 1,
		NoDefaultUserAgentHeader:  true,
		Name:                      "llmgw-probe",
		IsTLS:                     rt.tlsCfg != nil,
		TLSConfig:                 rt.tlsCfg,
	}
	defer client.CloseIdleConnections()
	url := rt.scheme + "://" + ep.Addr + p.Path
	fails, oks := 0, 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		ok := probeOnce(client, url, p.Timeout.Std())
		if ok {
			fails, oks = 0, oks+1
			if oks >= p.Successes && ep.SetDown(false) {
				s.log.Info("endpoint up", "rule", rt.rule.Name, "endpoint", ep.ID)
				s.metrics.probeTransitions.WithLabelValues(rt.rule.Name, ep.ID, "up").Inc()
			}
		} else {
			oks, fails = 0, fails+1
			if fails >= p.Failures && ep.SetDown(true) {
				s.log.Warn("endpoint down", "rule", rt.rule.Name, "endpoint", ep.ID, "failures", fails)
				s.metrics.probeTransitions.WithLabelValues(rt.rule.Name, ep.ID, "down").Inc()
			}
		}
		timer.Reset(p.Interval.Std())
	}
}

// probeOnce reports whether GET url answered 2xx within timeout.
func probeOnce(c *fasthttp.HostClient, url string, timeout time.Duration) bool {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodGet)
	// Every probe goes on a new connection: it proves that the worker
	// accepts connections (what a request needs), it can never meet a
	// connection the engine closed while idle, and it keeps none of the
	// engine's connection slots (llama-server serves only a few) between
	// probes.
	req.SetConnectionClose()
	if err := c.DoTimeout(req, resp, timeout); err != nil {
		return false
	}
	code := resp.StatusCode()
	return code >= 200 && code < 300
}

package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// metrics holds the gateway's Prometheus series. Live per-endpoint state
// (in-flight, health, breaker, drain) is read at scrape time by a collector,
// so it can never drift from the data plane and needs no cleanup when a rule
// goes away.
type metrics struct {
	reg *prometheus.Registry

	requests           *prometheus.CounterVec
	rejected           *prometheus.CounterVec
	retries            *prometheus.CounterVec
	redials            *prometheus.CounterVec
	oneShots           *prometheus.CounterVec
	upstreamFailures   *prometheus.CounterVec
	clientFault5xx     *prometheus.CounterVec
	clientCancels      *prometheus.CounterVec
	acceptErrors       *prometheus.CounterVec
	loopHandoffs       *prometheus.CounterVec
	budgetExceeded     *prometheus.CounterVec
	streamErrors       *prometheus.CounterVec
	breakerTransitions *prometheus.CounterVec
	probeTransitions   *prometheus.CounterVec
	upstreamLatency    *prometheus.HistogramVec
	ttfb               *prometheus.HistogramVec
	overhead           *prometheus.HistogramVec

	pdRequests        *prometheus.CounterVec
	pdPrefillDuration *prometheus.HistogramVec
	pdDecodeTTFT      *prometheus.HistogramVec
	pdKVParams        *prometheus.CounterVec
	pdEarlyExit       *prometheus.CounterVec

	kvHits    *prometheus.CounterVec
	kvMisses  *prometheus.CounterVec
	kvMatched *prometheus.HistogramVec
	kvParity  *prometheus.CounterVec
}

func newMetrics(s *Server) *metrics {
	reg := prometheus.NewRegistry()
	latencyBuckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_requests_total", Help: "Proxied requests by rule, endpoint and HTTP status relayed to the client (endpoint empty when none was chosen).",
		}, []string{"rule", "endpoint", "status"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_rejected_requests_total", Help: "Requests refused by the gateway before routing, by reason.",
		}, []string{"reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_retries_total", Help: "Requests retried on another endpoint after a failure before any response byte.",
		}, []string{"rule"}),
		redials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_upstream_redials_total", Help: "Requests sent again on a new connection to the same endpoint because the pooled connection was found dead before anything was written to it (not charged to the endpoint).",
		}, []string{"rule", "endpoint"}),
		oneShots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_upstream_oneshot_requests_total", Help: "Requests sent on a one-shot connection (Connection: close) because every connection the gateway keeps to an engine with few serving threads (llama.cpp: half of them) was busy.",
		}, []string{"rule", "endpoint"}),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_upstream_failures_total", Help: "Failed upstream sends by stage: not_sent (connect, DNS, TLS handshake, write failed or dead pooled connections: retried elsewhere) or after_send (the whole request was written: relayed as an error, never retried).",
		}, []string{"rule", "endpoint", "stage"}),
		clientFault5xx: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_upstream_client_fault_5xx_total", Help: "5xx answers the engine's adapter classes as the client's fault (e.g. llama.cpp's 500 for malformed JSON or n>1); relayed, never counted toward origin-5xx demotion.",
		}, []string{"rule", "endpoint"}),
		clientCancels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_client_cancels_total", Help: "Streams the client abandoned; the worker request was cancelled.",
		}, []string{"rule"}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_stream_errors_total", Help: "Streams whose worker failed after the response began.",
		}, []string{"rule", "endpoint"}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_breaker_transitions_total", Help: "Circuit breaker state changes, by the state entered.",
		}, []string{"rule", "endpoint", "to"}),
		probeTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_probe_transitions_total", Help: "Active health verdict changes, by the verdict entered (up or down).",
		}, []string{"rule", "endpoint", "to"}),
		upstreamLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_upstream_duration_seconds", Help: "Time from sending the request to a worker until its response ended.", Buckets: latencyBuckets,
		}, []string{"rule"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_upstream_first_byte_seconds", Help: "Time from sending the request to a worker until its response headers arrived.", Buckets: latencyBuckets,
		}, []string{"rule"}),
		overhead: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgw_gateway_overhead_seconds",
			Help:    "Time the gateway added: total request time minus the time spent waiting on the worker.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .05},
		}, []string{"rule"}),
	}
	m.acceptErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_accept_errors_total", Help: "Failed accepts on a data-plane listener that were retried after a back-off, by listener address and reason (emfile, enfile, enobufs, enomem, aborted, timeout).",
	}, []string{"listener", "reason"})
	m.loopHandoffs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_loop_handoffs_total", Help: "Client connections the loop plane handed to the goroutine plane, by the reason its request was not one the loop plane serves (http10, chunked_body, expect, too_large, malformed, route, rejected, rule, uri); the goroutine plane answers that request and the connection's later ones.",
	}, []string{"reason"})
	for _, r := range handoffReasons {
		m.loopHandoffs.WithLabelValues(r)
	}
	m.budgetExceeded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_buffer_budget_exceeded_total", Help: "Responses that did not fit in the buffer budget, by outcome: streamed (relayed unbuffered instead) or refused (503: the client needed a buffered answer).",
	}, []string{"outcome"})
	reg.MustRegister(m.acceptErrors, m.loopHandoffs, m.budgetExceeded,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_buffered_body_bytes", Help: "Bytes of response bodies held in memory now (bounded by --buffer-budget-bytes).",
		}, func() float64 { return float64(s.budget.used.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_buffer_budget_bytes", Help: "The configured buffer budget (--buffer-budget-bytes).",
		}, func() float64 { return float64(s.budget.limit) }))
	m.pdRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_pd_requests_total", Help: "P/D requests by phase (prefill, decode, complete) and status (success, timeout, error; cancelled: a concurrent prefill ended because its decode failed).",
	}, []string{"rule", "phase", "status"})
	m.pdPrefillDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "llmgw_pd_prefill_duration_seconds", Help: "Duration of P/D prefill (context) legs.", Buckets: latencyBuckets,
	}, []string{"rule"})
	m.pdDecodeTTFT = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "llmgw_pd_decode_ttft_seconds", Help: "Time from sending the decode leg to its response headers.", Buckets: latencyBuckets,
	}, []string{"rule"})
	m.pdKVParams = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_pd_handoff_params_total", Help: "Hand-off parameters (the engine adapter's hand-off object, carried from the prefill answer to the decode) found or missing in prefill answers; out_of_band: none to carry, the KV moves between the engines (vLLM P2P-NCCL, p2p_nccl_port).",
	}, []string{"rule", "outcome"})
	m.pdEarlyExit = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_pd_early_exit_total", Help: "TRT-LLM requests answered entirely by the context phase.",
	}, []string{"rule"})
	reg.MustRegister(m.pdRequests, m.pdPrefillDuration, m.pdDecodeTTFT, m.pdKVParams, m.pdEarlyExit)
	m.kvHits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_kv_hits_total", Help: "KV-exact decisions that routed to an endpoint holding at least the rule's kvHitMinShare of the prompt's blocks.",
	}, []string{"rule", "endpoint"})
	m.kvMisses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_kv_misses_total", Help: "KV-exact decisions that were not hits, by reason: fell back to the rule's policy (tokenize; for kvTokenizer engine tokenize_timeout, tokenize_engine, tokenize_no_worker; short, no_match, not_ready, overloaded), or chose an endpoint holding no block (spill) or less than kvHitMinShare of them (partial).",
	}, []string{"rule", "reason"})
	m.kvMatched = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "llmgw_kv_matched_blocks", Help: "Prefix blocks the chosen endpoint held, per KV-exact decision.",
		Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048},
	}, []string{"rule"})
	m.kvParity = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_kv_parity_checks_total", Help: "Self-check of engine-reported cached tokens against the gateway's prediction, by outcome (agree, mismatch, neutral).",
	}, []string{"rule", "outcome"})
	reg.MustRegister(m.kvHits, m.kvMisses, m.kvMatched, m.kvParity, &kvCollector{s: s})
	reg.MustRegister(m.requests, m.rejected, m.retries, m.redials, m.oneShots, m.upstreamFailures, m.clientFault5xx, m.clientCancels, m.streamErrors,
		m.breakerTransitions, m.probeTransitions, m.upstreamLatency, m.ttfb, m.overhead,
		&liveCollector{s: s},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ruleMetrics holds a rule's series with their labels resolved once, so
// that recording a request does not hash label values on the hot path.
type ruleMetrics struct {
	m                        *metrics
	rule                     string
	upstream, ttfb, overhead prometheus.Observer
	ok                       []prometheus.Counter // status 200, by endpoint Index
}

func (m *metrics) forRule(rule string, endpointIDs []string) *ruleMetrics {
	rm := &ruleMetrics{m: m, rule: rule,
		upstream: m.upstreamLatency.WithLabelValues(rule),
		ttfb:     m.ttfb.WithLabelValues(rule),
		overhead: m.overhead.WithLabelValues(rule),
	}
	for _, id := range endpointIDs {
		rm.ok = append(rm.ok, m.requests.WithLabelValues(rule, id, "200"))
	}
	return rm
}

// observe records one finished request on endpoint ep (its Index and ID).
func (rm *ruleMetrics) observe(epIndex int, epID string, status int, total, upstreamDur, ttfb time.Duration) {
	if status == 200 && epIndex >= 0 && epIndex < len(rm.ok) {
		rm.ok[epIndex].Inc()
	} else {
		rm.m.requests.WithLabelValues(rm.rule, epID, statusLabel(status)).Inc()
	}
	rm.upstream.Observe(upstreamDur.Seconds())
	rm.ttfb.Observe(ttfb.Seconds())
	if over := total - upstreamDur; over >= 0 {
		rm.overhead.Observe(over.Seconds())
	}
}

var (
	descInFlight = prometheus.NewDesc("llmgw_inflight_requests", "Requests in flight on an endpoint.", []string{"rule", "endpoint"}, nil)
	descUp       = prometheus.NewDesc("llmgw_endpoint_healthy", "1 when the endpoint's active health probe says up.", []string{"rule", "endpoint"}, nil)
	descAvail    = prometheus.NewDesc("llmgw_endpoint_available", "1 when the endpoint takes new requests (healthy, breaker not open, not draining).", []string{"rule", "endpoint"}, nil)
	descDraining = prometheus.NewDesc("llmgw_endpoint_draining", "1 while the endpoint is drained.", []string{"rule", "endpoint"}, nil)
	descBreaker  = prometheus.NewDesc("llmgw_breaker_state", "Circuit breaker state: 0 closed, 1 open, 2 half-open; absent when disabled.", []string{"rule", "endpoint"}, nil)
)

// liveCollector reads endpoint state at scrape time.
type liveCollector struct{ s *Server }

func (c *liveCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descInFlight
	ch <- descUp
	ch <- descAvail
	ch <- descDraining
	ch <- descBreaker
}

func (c *liveCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	rts := make([]*ruleRuntime, 0, len(c.s.rules))
	for _, rt := range c.s.rules {
		rts = append(rts, rt)
	}
	c.s.mu.Unlock()
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, rt := range rts {
		for _, ep := range rt.eps {
			n, id := rt.rule.Name, ep.ID
			ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(ep.InFlight()), n, id)
			ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, b2f(!ep.Down()), n, id)
			ch <- prometheus.MustNewConstMetric(descAvail, prometheus.GaugeValue, b2f(ep.Available()), n, id)
			ch <- prometheus.MustNewConstMetric(descDraining, prometheus.GaugeValue, b2f(ep.Draining()), n, id)
			if b := ep.Breaker(); b != nil {
				ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, float64(breakerValue(b.State())), n, id)
			}
		}
	}
}

func breakerValue(s upstream.BreakerState) int { return int(s) }

// kvObserve records one KV-exact decision of kv's rule (its counters and
// its recent window).
func (m *metrics) kvObserve(rule string, kv *kvRuntime, c *kvChoice) {
	kv.health.decision(c)
	if c.ep != nil && c.hit {
		m.kvHits.WithLabelValues(rule, c.ep.ID).Inc()
	} else {
		m.kvMisses.WithLabelValues(rule, c.reason).Inc()
	}
	if c.ep != nil {
		m.kvMatched.WithLabelValues(rule).Observe(float64(c.matched))
	}
}

var (
	descKVBlocks          = prometheus.NewDesc("llmgw_kv_inventory_blocks", "Blocks in an endpoint's KV inventory.", []string{"rule", "endpoint"}, nil)
	descKVConnected       = prometheus.NewDesc("llmgw_kv_events_connected", "1 while the endpoint's KV event stream is connected (TRT-LLM: polled and admitted).", []string{"rule", "endpoint"}, nil)
	descKVEvents          = prometheus.NewDesc("llmgw_kv_events_total", "KV events applied to an endpoint's inventory.", []string{"rule", "endpoint"}, nil)
	descKVResyncs         = prometheus.NewDesc("llmgw_kv_resyncs_total", "Inventory clears after a sequence gap, regression, publisher restart or AllBlocksCleared.", []string{"rule", "endpoint"}, nil)
	descKVMalformed       = prometheus.NewDesc("llmgw_kv_malformed_batches_total", "KV event batches dropped as malformed.", []string{"rule", "endpoint"}, nil)
	descKVMalformedEvents = prometheus.NewDesc("llmgw_kv_malformed_events_total", "Single KV events (TensorRT-LLM) rejected as malformed inside an otherwise valid drain response; the drain's other events were applied.", []string{"rule", "endpoint"}, nil)
	descKVTokCacheBytes   = prometheus.NewDesc("llmgw_kv_token_cache_bytes", "Bytes the live entries of a KV-exact rule's token cache take (prompt segments or /tokenize bodies, 4 per token id, a 16-byte header each) in its arena, which is llmgw serve --kv-token-cache-bytes outside the Go heap.", []string{"rule"}, nil)
	descKVTokCacheEntries = prometheus.NewDesc("llmgw_kv_token_cache_entries", "Entries in a KV-exact rule's token cache.", []string{"rule"}, nil)
	descKVTokCacheLookups = prometheus.NewDesc("llmgw_kv_token_cache_lookups_total", "Token cache lookups of a KV-exact rule by result (hit, miss); the hit ratio is hit over both.", []string{"rule", "result"}, nil)
	descKVBroken          = prometheus.NewDesc("llmgw_kv_parity_broken", "1 when the self-check sees the engine's cache reuse disagree with the gateway's hashes.", []string{"rule"}, nil)
	descKVPolls           = prometheus.NewDesc("llmgw_kv_event_polls_total", "KV event drains sent to an endpoint whose engine is polled over HTTP (TensorRT-LLM POST /kv_cache_events); the poller backs off to twice a second while the worker is idle.", []string{"rule", "endpoint"}, nil)
	descKVWindow          = prometheus.NewDesc("llmgw_kv_window_decisions", "KV-exact decisions among the rule's last 100, by outcome (hit, or the miss reason of llmgw_kv_misses_total).", []string{"rule", "outcome"}, nil)
	descKVWindowHitRatio  = prometheus.NewDesc("llmgw_kv_window_hit_ratio", "Hits over the KV-exact decisions among the rule's last 100 (0 with none).", []string{"rule"}, nil)
	descKVWindowParity    = prometheus.NewDesc("llmgw_kv_window_parity_checks", "Self-checked responses among the rule's last 100 that agreed or mismatched, by outcome.", []string{"rule", "outcome"}, nil)
	descRuleDegraded      = prometheus.NewDesc("llmgw_rule_degraded", "1 while the rule serves degraded for the cause (kv_tokenize: half or more of its last 100 KV-exact decisions, at least 10, failed to tokenize; kv_parity: half or more of its last 100 self-checked responses, at least 10, mismatched, or the parity streak broke); a warning, the rule stays ready.", []string{"rule", "cause"}, nil)
)

// kvCollector reads KV ingestion state at scrape time.
type kvCollector struct{ s *Server }

func (c *kvCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKVBlocks, descKVConnected, descKVEvents, descKVResyncs, descKVMalformed, descKVMalformedEvents, descKVBroken, descKVTokCacheBytes, descKVTokCacheEntries, descKVTokCacheLookups,
		descKVWindow, descKVWindowHitRatio, descKVWindowParity, descRuleDegraded, descKVPolls} {
		ch <- d
	}
}

func (c *kvCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	rts := make([]*ruleRuntime, 0, len(c.s.rules))
	for _, rt := range c.s.rules {
		if rt.kv != nil {
			rts = append(rts, rt)
		}
	}
	c.s.mu.Unlock()
	for _, rt := range rts {
		n := rt.rule.Name
		broken := 0.0
		if rt.kv.parity.status().Broken {
			broken = 1
		}
		ch <- prometheus.MustNewConstMetric(descKVBroken, prometheus.GaugeValue, broken, n)
		ws := rt.kv.health.status()
		ch <- prometheus.MustNewConstMetric(descKVWindow, prometheus.GaugeValue, float64(ws.Hits), n, "hit")
		for _, o := range kvOutcomes[1:] {
			ch <- prometheus.MustNewConstMetric(descKVWindow, prometheus.GaugeValue, float64(ws.Misses[o]), n, o)
		}
		ch <- prometheus.MustNewConstMetric(descKVWindowHitRatio, prometheus.GaugeValue, ws.HitShare, n)
		ch <- prometheus.MustNewConstMetric(descKVWindowParity, prometheus.GaugeValue, float64(ws.ParityChecked-ws.ParityMismatches), n, "agree")
		ch <- prometheus.MustNewConstMetric(descKVWindowParity, prometheus.GaugeValue, float64(ws.ParityMismatches), n, "mismatch")
		causes := degraded(ws, rt.kv.parity.status())
		for _, c := range kvDegradeCauses {
			on := 0.0
			if _, ok := causes[c]; ok {
				on = 1
			}
			ch <- prometheus.MustNewConstMetric(descRuleDegraded, prometheus.GaugeValue, on, n, c)
		}
		cs := rt.kv.tok.cacheStats()
		ch <- prometheus.MustNewConstMetric(descKVTokCacheBytes, prometheus.GaugeValue, float64(cs.Bytes), n)
		ch <- prometheus.MustNewConstMetric(descKVTokCacheEntries, prometheus.GaugeValue, float64(cs.Entries), n)
		ch <- prometheus.MustNewConstMetric(descKVTokCacheLookups, prometheus.CounterValue, float64(cs.Hits), n, "hit")
		ch <- prometheus.MustNewConstMetric(descKVTokCacheLookups, prometheus.CounterValue, float64(cs.Misses), n, "miss")
		for i, ep := range rt.kv.pool {
			st := rt.kv.ingest[i].State()
			conn := 0.0
			if st.Connected && (st.Admission == "" || st.Admission == "admitted") {
				conn = 1
			}
			ch <- prometheus.MustNewConstMetric(descKVBlocks, prometheus.GaugeValue, float64(rt.kv.index.Blocks(i)), n, ep.ID)
			ch <- prometheus.MustNewConstMetric(descKVConnected, prometheus.GaugeValue, conn, n, ep.ID)
			ch <- prometheus.MustNewConstMetric(descKVEvents, prometheus.CounterValue, float64(st.Events), n, ep.ID)
			ch <- prometheus.MustNewConstMetric(descKVResyncs, prometheus.CounterValue, float64(st.Resyncs), n, ep.ID)
			ch <- prometheus.MustNewConstMetric(descKVMalformed, prometheus.CounterValue, float64(st.Malformed), n, ep.ID)
			ch <- prometheus.MustNewConstMetric(descKVMalformedEvents, prometheus.CounterValue, float64(st.MalformedEvents), n, ep.ID)
			if st.Admission != "" { // polled over HTTP (TensorRT-LLM)
				ch <- prometheus.MustNewConstMetric(descKVPolls, prometheus.CounterValue, float64(st.Polls), n, ep.ID)
			}
		}
	}
}

// dropRule removes a deleted rule's series, so /metrics does not keep
// reporting a rule that no longer exists.
func (m *metrics) dropRule(rule string) {
	l := prometheus.Labels{"rule": rule}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		m.requests, m.retries, m.redials, m.oneShots, m.upstreamFailures, m.clientFault5xx, m.clientCancels, m.streamErrors,
		m.breakerTransitions, m.probeTransitions, m.upstreamLatency, m.ttfb, m.overhead, m.pdRequests, m.pdPrefillDuration, m.pdDecodeTTFT,
		m.pdKVParams, m.pdEarlyExit, m.kvHits, m.kvMisses, m.kvMatched, m.kvParity,
	} {
		v.DeletePartialMatch(l)
	}
}

package sim

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/vllm"
)

// ttftBuckets are vLLM's time_to_first_token_seconds bucket bounds.
var ttftBuckets = [...]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// metrics are the counters behind each persona's metrics endpoint. All
// fields are updated atomically; readers may see a mix of old and new values
// across fields, as a Prometheus scrape of a live engine does.
type metrics struct {
	promptTokens     atomic.Int64
	generationTokens atomic.Int64
	prefixQueries    atomic.Int64
	prefixHits       atomic.Int64
	success          [3]atomic.Int64 // stop, length, abort
	ttftCount        atomic.Int64
	ttftSumMicros    atomic.Int64
	ttftBucket       [len(ttftBuckets)]atomic.Int64 // cumulative: le=ttftBuckets[i]
}

func (m *metrics) observeTTFT(d time.Duration) {
	m.ttftCount.Add(1)
	m.ttftSumMicros.Add(d.Microseconds())
	sec := d.Seconds()
	for i, b := range ttftBuckets {
		if sec <= b {
			m.ttftBucket[i].Add(1)
		}
	}
}

func (m *metrics) finished(reason string) {
	switch reason {
	case "stop":
		m.success[0].Add(1)
	case "length":
		m.success[1].Add(1)
	default:
		m.success[2].Add(1)
	}
}

// finishedReasons label request_success_total's samples, in the order of
// metrics.success.
var finishedReasons = [...]string{"stop", "length", "abort"}

// collector is a prometheus.Collector over one Sim's live counters: each
// scrape reads the atomics and the cache as they are then, the way an
// engine's registry reads its own state. The family names are the real
// engines' own, counters with their _total suffix as the engines name them
// (Python's prometheus_client puts the suffix on the HELP and TYPE lines
// too, and client_golang writes a counter's name as given; see the metrics
// fixtures under engines/<engine>/testdata/cases).
type collector struct{ s *Sim }

func (c collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c collector) Collect(ch chan<- prometheus.Metric) { c.s.collectMetrics(ch) }

// emitter sends const metrics carrying one persona's constant labels.
type emitter struct {
	ch     chan<- prometheus.Metric
	labels prometheus.Labels // the persona's labels on every series
}

func (e emitter) desc(name, help string, variable ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, variable, e.labels)
}

func (e emitter) gauge(name, help string, v float64) {
	e.ch <- prometheus.MustNewConstMetric(e.desc(name, help), prometheus.GaugeValue, v)
}

// counter is a counter family; name is the engine's, suffix included
// (llama.cpp's n_busy_slots_per_decode has none).
func (e emitter) counter(name, help string, v float64) {
	e.ch <- prometheus.MustNewConstMetric(e.desc(name, help), prometheus.CounterValue, v)
}

// requestSuccess is the per-finished_reason counter vLLM and trtllm-serve
// expose.
func (e emitter) requestSuccess(name string, m *metrics) {
	d := e.desc(name, "Count of successfully processed requests.", "finished_reason")
	for i, r := range finishedReasons {
		e.ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(m.success[i].Load()), r)
	}
}

func (e emitter) ttft(name string, m *metrics) {
	buckets := make(map[float64]uint64, len(ttftBuckets))
	for i, b := range ttftBuckets {
		buckets[b] = uint64(m.ttftBucket[i].Load())
	}
	e.ch <- prometheus.MustNewConstHistogram(e.desc(name, "Histogram of time to first token in seconds."),
		uint64(m.ttftCount.Load()), float64(m.ttftSumMicros.Load())/1e6, buckets)
}

// collectMetrics sends the persona's series.
func (s *Sim) collectMetrics(ch chan<- prometheus.Metric) {
	m := &s.metrics
	usage := float64(s.cacheLen()) / float64(s.cfg.CacheBlocks*len(s.ranks))
	running, waiting := float64(s.running.Load()), float64(s.waiting.Load())
	hitRate := 0.0
	if q := m.prefixQueries.Load(); q > 0 {
		hitRate = float64(m.prefixHits.Load()) / float64(q)
	}
	e := emitter{ch: ch}
	switch s.cfg.Engine {
	case engines.VLLM:
		// vLLM v1's PrometheusStatLogger series, labelled (model_name,
		// engine). The pre-0.12 gpu_ aliases are hidden by default since
		// vLLM PR #29330, so they are not exposed.
		e.labels = prometheus.Labels{"engine": "0", "model_name": s.cfg.Model}
		e.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running)
		e.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
		e.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
		e.counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", float64(m.prefixQueries.Load()))
		e.counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", float64(m.prefixHits.Load()))
		e.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", float64(m.promptTokens.Load()))
		e.counter("vllm:generation_tokens_total", "Number of generation tokens processed.", float64(m.generationTokens.Load()))
		e.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", 0)
		e.requestSuccess("vllm:request_success_total", m)
		e.ttft("vllm:time_to_first_token_seconds", m)
		// The cache configuration, one sample per engine (DP rank), as
		// vLLM publishes it from start-up: a fresh worker tells its block
		// size and hash algorithm before any request.
		for i := range s.ranks {
			d := prometheus.NewDesc(vllm.CacheConfigInfo, vllm.CacheConfigInfoHelp, nil, vllm.CacheConfigLabels(s.cfg.BlockSize, s.cfg.CacheBlocks, s.cfg.HashAlgo, i))
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, 1)
		}
	case engines.SGLang:
		// SGLang's scheduler gauges and tokenizer counters
		// (python/sglang/srt/metrics/collector.py).
		e.labels = prometheus.Labels{"model_name": s.cfg.Model}
		e.gauge("sglang:num_running_reqs", "The number of running requests.", running)
		e.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", waiting)
		e.gauge("sglang:token_usage", "The token usage.", usage)
		e.gauge("sglang:num_used_tokens", "The number of used tokens.", float64(s.cacheLen()*s.cfg.BlockSize))
		e.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hitRate)
		e.gauge("sglang:gen_throughput", "The generation throughput (token/s).", 0)
		e.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", float64(m.promptTokens.Load()))
		e.counter("sglang:generation_tokens_total", "Number of generation tokens processed.", float64(m.generationTokens.Load()))
		e.counter("sglang:cached_tokens_total", "Number of cached prompt tokens.", float64(m.prefixHits.Load()))
		e.counter("sglang:num_requests_total", "Number of requests processed.", float64(m.success[0].Load()+m.success[1].Load()+m.success[2].Load()))
		e.ttft("sglang:time_to_first_token_seconds", m)
	case engines.TRTLLM:
		// trtllm-serve's MetricsCollector (tensorrt_llm/metrics/collector.py)
		// with the labels openai_server.py gives it: model_name and
		// engine_type, both "undefined".
		e.labels = prometheus.Labels{"engine_type": "undefined", "model_name": "undefined"}
		e.gauge("trtllm_num_requests_running", "Number of active requests", running)
		e.gauge("trtllm_num_requests_waiting", "Number of queued requests", waiting)
		e.gauge("trtllm_kv_cache_utilization", "KV cache utilization", usage)
		e.gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", hitRate)
		e.requestSuccess("trtllm_request_success_total", m)
		e.counter("trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed.", float64(m.promptTokens.Load()))
		e.counter("trtllm_generation_tokens_total", "Cumulative number of generation (output) tokens produced.", float64(m.generationTokens.Load()))
		e.counter("trtllm_prompt_cached_tokens_total", "Total prompt tokens served from KV cache.", float64(m.prefixHits.Load()))
		e.ttft("trtllm_time_to_first_token_seconds", m)
	case engines.LlamaCpp:
		s.collectLlamaMetrics(e)
	}
}

// renderMetrics returns the persona's Prometheus text (format 0.0.4),
// gathered through a client_golang registry holding only the persona's
// collector. Names, types and label sets are the engines'; three things
// client_golang writes its own way, the same samples to any scraper:
// families come out sorted by name and labels by label name (the engines
// write registration order); values are Go's shortest form ("35",
// "390.2439024390244": llama-server's C++ stream writes 390.244 and
// Python's prometheus_client writes 35.0); and no _created series are
// written (whether each engine's deployment emits them is not
// established).
func (s *Sim) renderMetrics() ([]byte, error) {
	s.promOnce.Do(func() {
		s.promReg = prometheus.NewPedanticRegistry()
		s.promErr = s.promReg.Register(collector{s})
	})
	if s.promErr != nil {
		return nil, fmt.Errorf("sim metrics: register: %w", s.promErr)
	}
	mfs, err := s.promReg.Gather()
	if err != nil {
		return nil, fmt.Errorf("sim metrics: gather: %w", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, fmt.Errorf("sim metrics: encode %s: %w", mf.GetName(), err)
		}
	}
	return buf.Bytes(), nil
}

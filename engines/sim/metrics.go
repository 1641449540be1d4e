package sim

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/engines"
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
	ttftBucket       [len(ttftBuckets)]atomic.Int64
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

// promWriter appends Prometheus text exposition format.
type promWriter struct {
	b      []byte
	labels string // e.g. `model_name="x",engine="0"`
}

func (p *promWriter) family(name, typ, help string) {
	p.b = append(p.b, "# HELP "...)
	p.b = append(p.b, name...)
	p.b = append(p.b, ' ')
	p.b = append(p.b, help...)
	p.b = append(p.b, "\n# TYPE "...)
	p.b = append(p.b, name...)
	p.b = append(p.b, ' ')
	p.b = append(p.b, typ...)
	p.b = append(p.b, '\n')
}

func (p *promWriter) sample(name, extra string, v float64) {
	p.b = append(p.b, name...)
	if p.labels != "" || extra != "" {
		p.b = append(p.b, '{')
		p.b = append(p.b, p.labels...)
		if extra != "" {
			if p.labels != "" {
				p.b = append(p.b, ',')
			}
			p.b = append(p.b, extra...)
		}
		p.b = append(p.b, '}')
	}
	p.b = append(p.b, ' ')
	p.b = strconv.AppendFloat(p.b, v, 'g', -1, 64)
	p.b = append(p.b, '\n')
}

func (p *promWriter) gauge(name, help string, v float64) {
	p.family(name, "gauge", help)
	p.sample(name, "", v)
}

// pyCounter writes a counter the way Python's prometheus_client exposes it
// in text format 0.0.4: the HELP and TYPE lines carry the sample name with
// its _total suffix (prometheus/client_python exposition.generate_latest;
// see the metrics fixtures under engines/<engine>/testdata/cases). name
// includes the suffix.
func (p *promWriter) pyCounter(name, help string, v float64) {
	p.family(name, "counter", help)
	p.sample(name, "", v)
}

func (p *promWriter) ttft(s *Sim, name string) {
	p.family(name, "histogram", "Histogram of time to first token in seconds.")
	for i, b := range ttftBuckets {
		p.sample(name+"_bucket", `le="`+strconv.FormatFloat(b, 'g', -1, 64)+`"`, float64(s.metrics.ttftBucket[i].Load()))
	}
	n := float64(s.metrics.ttftCount.Load())
	p.sample(name+"_bucket", `le="+Inf"`, n)
	p.sample(name+"_count", "", n)
	p.sample(name+"_sum", "", float64(s.metrics.ttftSumMicros.Load())/1e6)
}

// renderMetrics returns the persona's Prometheus text.
func (s *Sim) renderMetrics() []byte {
	m := &s.metrics
	usage := float64(s.cacheLen()) / float64(s.cfg.CacheBlocks*len(s.ranks))
	running, waiting := float64(s.running.Load()), float64(s.waiting.Load())
	p := &promWriter{}
	switch s.cfg.Engine {
	case engines.VLLM:
		// vLLM v1's PrometheusStatLogger series, labelled (model_name,
		// engine). The pre-0.12 gpu_ aliases are hidden by default since
		// vLLM PR #29330, so they are not exposed.
		p.labels = `engine="0",model_name="` + s.cfg.Model + `"`
		p.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running)
		p.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
		p.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
		p.pyCounter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", float64(m.prefixQueries.Load()))
		p.pyCounter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", float64(m.prefixHits.Load()))
		p.pyCounter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", float64(m.promptTokens.Load()))
		p.pyCounter("vllm:generation_tokens_total", "Number of generation tokens processed.", float64(m.generationTokens.Load()))
		p.pyCounter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", 0)
		p.family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
		for i, r := range [...]string{"stop", "length", "abort"} {
			p.sample("vllm:request_success_total", `finished_reason="`+r+`"`, float64(m.success[i].Load()))
		}
		p.ttft(s, "vllm:time_to_first_token_seconds")
	case engines.SGLang:
		// SGLang's scheduler gauges and tokenizer counters
		// (python/sglang/srt/metrics/collector.py).
		p.labels = `model_name="` + s.cfg.Model + `"`
		p.gauge("sglang:num_running_reqs", "The number of running requests.", running)
		p.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", waiting)
		p.gauge("sglang:token_usage", "The token usage.", usage)
		p.gauge("sglang:num_used_tokens", "The number of used tokens.", float64(s.cacheLen()*s.cfg.BlockSize))
		hitRate := 0.0
		if q := m.prefixQueries.Load(); q > 0 {
			hitRate = float64(m.prefixHits.Load()) / float64(q)
		}
		p.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hitRate)
		p.gauge("sglang:gen_throughput", "The generation throughput (token/s).", 0)
		p.pyCounter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", float64(m.promptTokens.Load()))
		p.pyCounter("sglang:generation_tokens_total", "Number of generation tokens processed.", float64(m.generationTokens.Load()))
		p.pyCounter("sglang:cached_tokens_total", "Number of cached prompt tokens.", float64(m.prefixHits.Load()))
		p.pyCounter("sglang:num_requests_total", "Number of requests processed.", float64(m.success[0].Load()+m.success[1].Load()+m.success[2].Load()))
		p.ttft(s, "sglang:time_to_first_token_seconds")
	case engines.TRTLLM:
		// trtllm-serve's MetricsCollector (tensorrt_llm/metrics/collector.py)
		// with the labels openai_server.py gives it: model_name and
		// engine_type, both "undefined".
		p.labels = `engine_type="undefined",model_name="undefined"`
		p.gauge("trtllm_num_requests_running", "Number of active requests", running)
		p.gauge("trtllm_num_requests_waiting", "Number of queued requests", waiting)
		p.gauge("trtllm_kv_cache_utilization", "KV cache utilization", usage)
		hitRate := 0.0
		if q := m.prefixQueries.Load(); q > 0 {
			hitRate = float64(m.prefixHits.Load()) / float64(q)
		}
		p.gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", hitRate)
		p.family("trtllm_request_success_total", "counter", "Count of successfully processed requests.")
		for i, r := range [...]string{"stop", "length", "abort"} {
			p.sample("trtllm_request_success_total", `finished_reason="`+r+`"`, float64(m.success[i].Load()))
		}
		p.pyCounter("trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed.", float64(m.promptTokens.Load()))
		p.pyCounter("trtllm_generation_tokens_total", "Cumulative number of generation (output) tokens produced.", float64(m.generationTokens.Load()))
		p.ttft(s, "trtllm_time_to_first_token_seconds")
	case engines.LlamaCpp:
		s.appendLlamaMetrics(p)
	}
	return p.b
}

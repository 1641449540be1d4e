package harness

import (
	"bytes"
	"context"
	"fmt"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a Prometheus text endpoint, by family name.
type Metrics map[string]*dto.MetricFamily

// Scrape reads the gateway's GET /metrics from the admin listener.
func (g *Gateway) Scrape(ctx context.Context) (Metrics, error) {
	b, err := do(ctx, http.MethodGet, g.AdminURL()+"/metrics", "", nil)
	if err != nil {
		return nil, fmt.Errorf("harness: scrape: %w", err)
	}
	return ParseMetrics(b)
}

// ParseMetrics parses the Prometheus text exposition format.
func ParseMetrics(b []byte) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("harness: parse metrics: %w", err)
	}
	return Metrics(mfs), nil
}

// Sum adds the values (counter, gauge or untyped; a histogram's count) of
// the samples of family name whose labels include every name=value pair of
// match (pairs: "rule", "r1", "endpoint", "w1"). A missing family sums to 0.
func (m Metrics) Sum(name string, match ...string) float64 {
	mf := m[name]
	if mf == nil {
		return 0
	}
	var sum float64
next:
	for _, s := range mf.GetMetric() {
		for i := 0; i+1 < len(match); i += 2 {
			found := false
			for _, lp := range s.GetLabel() {
				if lp.GetName() == match[i] && lp.GetValue() == match[i+1] {
					found = true
					break
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case s.Counter != nil:
			sum += s.GetCounter().GetValue()
		case s.Gauge != nil:
			sum += s.GetGauge().GetValue()
		case s.Untyped != nil:
			sum += s.GetUntyped().GetValue()
		case s.Histogram != nil:
			sum += float64(s.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

package harness

import "testing"

func TestMetricsSum(t *testing.T) {
	text := `# TYPE llmgw_endpoint_healthy gauge
llmgw_endpoint_healthy{rule="r",endpoint="w1"} 1
llmgw_endpoint_healthy{rule="r",endpoint="w2"} 0
llmgw_endpoint_healthy{rule="s",endpoint="w1"} 1
# TYPE llmgw_requests_total counter
llmgw_requests_total{rule="r",endpoint="w1",code="200"} 7
llmgw_requests_total{rule="r",endpoint="w1",code="502"} 2
# TYPE process_open_fds gauge
process_open_fds 13
# TYPE lat histogram
lat_bucket{le="1"} 3
lat_bucket{le="+Inf"} 4
lat_sum 2.5
lat_count 4
`
	m, err := ParseMetrics([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		family string
		match  []string
		want   float64
	}{
		{"all samples of a gauge", "llmgw_endpoint_healthy", nil, 2},
		{"one label", "llmgw_endpoint_healthy", []string{"rule", "r"}, 1},
		{"two labels", "llmgw_endpoint_healthy", []string{"rule", "r", "endpoint", "w2"}, 0},
		{"counter across codes", "llmgw_requests_total", []string{"endpoint", "w1"}, 9},
		{"no labels", "process_open_fds", nil, 13},
		{"histogram counts observations", "lat", nil, 4},
		{"missing family", "nope", nil, 0},
		{"no matching label value", "llmgw_requests_total", []string{"code", "404"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := m.Sum(tc.family, tc.match...); got != tc.want {
				t.Errorf("Sum(%q, %q) = %v; want %v", tc.family, tc.match, got, tc.want)
			}
		})
	}
	if _, err := ParseMetrics([]byte("not { prometheus")); err == nil {
		t.Errorf("ParseMetrics accepted garbage")
	}
}

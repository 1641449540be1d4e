package k8s

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// WatchBackoff is how a lost list or watch is retried: 200 ms, doubling to
// at most 1 s, each with up to 20% jitter. client-go's reflector default
// (k8s.io/client-go v0.37.2 tools/cache/reflector.go, defaultBackoffInit
// 800 ms, defaultBackoffMax 30 s, jitter 1.0) is up to 60 s between tries
// after a long outage, so a change made after the API server returned took
// 20 s and more to arrive; with this one the first try after it returns is
// at most 1.2 s away. The price is about one list or watch request a
// second per watch while the API server is down. After two minutes without a failure
// the backoff starts again from its first step (the reflector's
// defaultBackoffReset).
var WatchBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Cap: time.Second, Steps: 10, Jitter: 0.2}

// Health counts and logs the loss and restoration of the watches a Source
// and a RuleSync run: a watch is lost when a list or watch request to the
// API server fails, and restored when one succeeds again. Its series are
// registered on the gateway's /metrics (gateway.Config.Collectors).
type Health struct {
	log      *slog.Logger
	lost     *prometheus.CounterVec
	restored *prometheus.CounterVec
	down     *prometheus.GaugeVec
}

// NewHealth returns a Health logging to log (nil: slog.Default()).
func NewHealth(log *slog.Logger) *Health {
	if log == nil {
		log = slog.Default()
	}
	return &Health{
		log: log,
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_k8s_watch_lost_total", Help: "Watches of the Kubernetes API that failed (a list or watch request refused or unanswered), by resource (pods, endpointslices, inferencepools, rules).",
		}, []string{"resource"}),
		restored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_k8s_watch_restored_total", Help: "Lost watches of the Kubernetes API that listed or watched again successfully, by resource.",
		}, []string{"resource"}),
		down: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmgw_k8s_watches_lost", Help: "Watches of the Kubernetes API lost now (retried every WatchBackoff step, at most 1.2 s apart), by resource.",
		}, []string{"resource"}),
	}
}

// Collectors are the series to register on /metrics.
func (h *Health) Collectors() []prometheus.Collector {
	return []prometheus.Collector{h.lost, h.restored, h.down}
}

// Counts returns how many watches of resource were lost and restored so
// far (for tests and the read-back).
func (h *Health) Counts(resource string) (lost, restored int) {
	return int(counterValue(h.lost.WithLabelValues(resource))), int(counterValue(h.restored.WithLabelValues(resource)))
}

// watchSpec is one watched kind: the list and watch calls and what the log
// names the watch by.
type watchSpec struct {
	resource string // pods, endpointslices, inferencepools, rules
	expected runtime.Object
	list     func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error)
	watch    func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
	attrs    []any // for the log: namespace, rule, ...
}

// watched is a running watch: a store the reflector keeps equal to the
// API server's objects, and a flag saying it has listed once.
type watched struct {
	store  cache.Store
	synced <-chan struct{} // closed once the first list is in store
}

// run starts a reflector for spec until ctx ends (wg is done when it has
// stopped). onChange is called, on the reflector's goroutine, with the
// keys (namespace/name) whose object was added, changed or deleted; after
// a relist, with the keys that differ from before.
func (h *Health) run(ctx context.Context, wg *sync.WaitGroup, spec watchSpec, onChange func(keys []string)) *watched {
	ns := &notifyStore{Store: cache.NewStore(cache.MetaNamespaceKeyFunc), onChange: onChange, synced: make(chan struct{})}
	lw := &healthLW{h: h, spec: spec}
	backoff := WatchBackoff
	r := cache.NewReflectorWithOptions(lw, spec.expected, ns, cache.ReflectorOptions{
		Name: "llmgw/" + spec.resource, Backoff: &backoff,
	})
	// The reflector's own error log stays as client-go writes it (klog);
	// ours is healthLW's, once per loss and once per restoration.
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.RunWithContext(ctx)
		lw.stopped()
	}()
	return &watched{store: ns, synced: ns.synced}
}

// healthLW wraps a watch's list and watch calls to see the API server
// answer or not.
type healthLW struct {
	h    *Health
	spec watchSpec
	mu   sync.Mutex
	down bool
}

func (l *healthLW) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	obj, err := l.spec.list(ctx, o)
	l.observe(ctx, err)
	return obj, err
}

// WatchWithContext starts a watch. One the API server has not answered
// within watchAnswer is given up and counts as a failure, to be retried
// with the backoff: a request sent while an API server is starting can
// sit unanswered for seconds after that server serves new requests.
func (l *healthLW) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	wctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(watchAnswer, cancel)
	w, err := l.spec.watch(wctx, o)
	timer.Stop()
	if err == nil && wctx.Err() != nil {
		w.Stop()
		err = wctx.Err()
	}
	if err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("no answer within %v: %w", watchAnswer, err)
		}
		cancel()
		l.observe(ctx, err)
		return nil, err
	}
	l.observe(ctx, nil)
	return &cancelWatch{Interface: w, cancel: cancel}, nil
}

// watchAnswer is how long a watch request may wait for the API server's
// answer (its response headers; the stream itself may then last minutes).
const watchAnswer = 2 * time.Second

// cancelWatch ends the watch's context when it is stopped.
type cancelWatch struct {
	watch.Interface
	cancel context.CancelFunc
}

func (w *cancelWatch) Stop() {
	w.Interface.Stop()
	w.cancel()
}

// List and Watch satisfy cache.ListerWatcher; the reflector calls the
// WithContext forms.
func (l *healthLW) List(o metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), o)
}

func (l *healthLW) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), o)
}

func (l *healthLW) observe(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // stopping: not the API server's doing
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	res := l.spec.resource
	switch {
	case err != nil && !l.down:
		l.down = true
		l.h.lost.WithLabelValues(res).Inc()
		l.h.down.WithLabelValues(res).Inc()
		l.h.log.Warn("kubernetes watch lost; retrying", append([]any{"resource", res, "err", err}, l.spec.attrs...)...)
	case err == nil && l.down:
		l.down = false
		l.h.restored.WithLabelValues(res).Inc()
		l.h.down.WithLabelValues(res).Dec()
		l.h.log.Info("kubernetes watch restored", append([]any{"resource", res}, l.spec.attrs...)...)
	}
}

// stopped takes a watch that ended while lost out of the gauge.
func (l *healthLW) stopped() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		l.down = false
		l.h.down.WithLabelValues(l.spec.resource).Dec()
	}
}

// notifyStore is a store that says which keys changed.
type notifyStore struct {
	cache.Store
	onChange func(keys []string)
	synced   chan struct{}
	once     sync.Once
}

func (s *notifyStore) one(obj any, err error) error {
	if err != nil {
		return err
	}
	if k, kerr := cache.MetaNamespaceKeyFunc(obj); kerr == nil {
		s.onChange([]string{k})
	}
	return nil
}

func (s *notifyStore) Add(obj any) error    { return s.one(obj, s.Store.Add(obj)) }
func (s *notifyStore) Update(obj any) error { return s.one(obj, s.Store.Update(obj)) }
func (s *notifyStore) Delete(obj any) error { return s.one(obj, s.Store.Delete(obj)) }
func (s *notifyStore) Resync() error        { return nil }

// Replace installs a relist's objects and reports the keys that were
// added, removed or changed (by resourceVersion) since the last state.
func (s *notifyStore) Replace(list []any, rv string) error {
	before := map[string]string{}
	for _, o := range s.Store.List() {
		if k, err := cache.MetaNamespaceKeyFunc(o); err == nil {
			before[k] = resourceVersion(o)
		}
	}
	if err := s.Store.Replace(list, rv); err != nil {
		return err
	}
	var changed []string
	for _, o := range list {
		k, err := cache.MetaNamespaceKeyFunc(o)
		if err != nil {
			continue
		}
		if v, ok := before[k]; !ok || v != resourceVersion(o) {
			changed = append(changed, k)
		}
		delete(before, k)
	}
	for k := range before {
		changed = append(changed, k)
	}
	if len(changed) > 0 {
		s.onChange(changed)
	}
	s.once.Do(func() { close(s.synced) })
	return nil
}

func resourceVersion(o any) string {
	if m, ok := o.(metav1.Object); ok {
		return m.GetResourceVersion()
	}
	return ""
}

// waitSynced blocks until every watch has listed once or ctx ends.
func waitSynced(ctx context.Context, ws ...*watched) bool {
	for _, w := range ws {
		select {
		case <-w.synced:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

# llmgw — build, test and measure. `make test` is what CI runs (.ci/run).
GO        ?= go
PKGS      := ./...
RACE_PKGS := ./gateway/... ./internal/rawio/ ./internal/peerwatch/ ./internal/evloop/ ./internal/h1/
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME  ?= 60s

.PHONY: all build test unit lint fmt-check vet staticcheck bench bench-deps bench-gateway fuzz clean test-faults soak

all: build

# demo: two simulated workers behind the gateway, live requests, read-back.
.PHONY: demo
demo:
	./scripts/demo.sh

# build stamps the VCS commit and time into the binary (llmgw --version),
# whatever GOFLAGS says about -buildvcs.
build:
	$(GO) build -buildvcs=auto -o bin/llmgw ./cmd/llmgw

# image builds the container image the Helm chart names by default
# (llmgw:<the chart's appVersion>): FROM scratch holding the static binary
# (deploy/image/Dockerfile). Needs a Docker daemon; nothing is pulled. The
# build flags are the fault suite's static build's (reliability/harness), so
# the two share the Go build cache.
IMAGE ?= llmgw:$(shell awk '$$1 == "appVersion:" { gsub(/"/, "", $$2); print $$2 }' deploy/helm/llmgw/Chart.yaml)
.PHONY: image
image:
	@mkdir -p bin/image
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -o bin/image/llmgw ./cmd/llmgw
	cp deploy/image/Dockerfile bin/image/Dockerfile
	docker build -q -t $(IMAGE) bin/image

# kube-apiserver builds the upstream API server from k8s.io/kubernetes in
# its own module (tools/kube-apiserver), so the main go.mod carries none of
# it, into bin/ for the real-API-server suite (internal/k8stest; etcd is
# Debian's etcd-server). A cold build took 7m40s wall (4m43s user) on 2 busy
# cores; later builds reuse the Go build cache.
# helm is the upstream Helm CLI (helm.sh/helm/v3 v3.22.0, tools/helm), for
# the test that renders deploy/helm/llmgw (about 1 minute to build).
.PHONY: kube-apiserver helm k8s-bins
# The module build has no git tree, so the version that hack/lib/version.sh
# stamps is given here from the module version in tools/kube-apiserver/go.mod
# (otherwise /version says v0.0.0-master+$$Format:%H$$).
K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2; exit }' tools/kube-apiserver/go.mod)
K8S_MAJOR   := $(word 1,$(subst ., ,$(patsubst v%,%,$(K8S_VERSION))))
K8S_MINOR   := $(word 2,$(subst ., ,$(patsubst v%,%,$(K8S_VERSION))))
K8S_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=$(K8S_VERSION) -X $(p).gitMajor=$(K8S_MAJOR) -X $(p).gitMinor=$(K8S_MINOR) -X $(p).gitCommit= -X $(p).buildDate=$(shell date -u +%Y-%m-%dT%H:%M:%SZ))
kube-apiserver:
	cd tools/kube-apiserver && $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o ../../bin/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
helm:
	cd tools/helm && $(GO) build -trimpath -o ../../bin/helm helm.sh/helm/v3/cmd/helm
k8s-bins: kube-apiserver helm

# test = lint + the default suite. Gateway packages run under the race
# detector; the rest run without it to keep the suite fast on 2 cores. The
# fault suite (test-faults, about 2.5 minutes on 2 busy cores) is part of it.
test: lint unit

unit:
	$(GO) test -race -count=1 $(RACE_PKGS)
	# The gateway suite again on the goroutine plane (the loop plane is the
	# default on Linux; every data-plane test must hold on both).
	LLMGW_TEST_DATA_PLANE=goroutine $(GO) test -count=1 ./gateway/
	# And on the loop plane without io_uring (a write(2) per request to a
	# worker), as on kernels that do not offer it.
	LLMGW_TEST_IO_URING=0 $(GO) test -count=1 ./gateway/
	$(GO) test -count=1 $$($(GO) list $(PKGS) | grep -v -e '/gateway' -e '/reliability' -e '/internal/rawio' -e '/internal/peerwatch' -e '/internal/evloop' -e '/internal/h1')
	$(MAKE) test-faults

lint: fmt-check vet staticcheck

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet -tags faults $(PKGS)

staticcheck:
	$(GO) run $(STATICCHECK) -tags faults $(PKGS)

# test-faults runs the end-to-end fault suite (build tag faults): the llmgw
# binary as gateway and simulator child processes on 127.0.0.1, plus Docker
# containers for the network partition test (skipped without a daemon,
# a failure under CI=true). See RELIABILITY.md.
test-faults:
	$(GO) test -tags faults -count=1 -timeout 10m ./reliability/...

# soak drives 1000 req/s of mixed traffic through a gateway and three
# simulators for SOAK_DURATION and writes reliability/soak-report/. Not in CI.
SOAK_DURATION ?= 30m
soak:
	$(GO) run ./reliability/soak -duration $(SOAK_DURATION) -rps 1000 -out reliability/soak-report

# Benchmarks are never part of `make test`; results go to BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# bench-gateway compares, in one run, a fixed-response worker reached
# directly, through llmgw (in the test's own process), through
# httputil.ReverseProxy and through nginx (a process of its own)
# (when installed: make bench-deps).
bench-gateway:
	$(GO) test -run '^$$' -bench 'Overhead' -benchtime 3s ./gateway/
	$(GO) test -run '^$$' -bench 'Pick' -benchmem ./gateway/policy/

# bench-overhead: the commands of BENCHMARKS.md's current section, one run
# each (direct, llmgw as a process, nginx and HAProxy side by side, 20
# interleaved 1 s rounds; make bench-deps first). The fixed-answer rows pin
# the targets and the fixed backend to CPU 0 and the load generator to CPU 1
# (2-core machine). The stall rows put llmgw and nginx without upstream
# keep-alive in front of the llama.cpp persona that writes like
# llama-server, at 1, 4 and 8 requests in flight, as is and with every CPU
# kept from halting (see BENCHMARKS.md for why both). About 20 minutes.
.PHONY: bench-overhead bench-routing
BENCH_OUT ?= /tmp/llmgw-bench
FIXED = ./bin/llmgw bench overhead --backend fixed --pin-targets 0 --pin-load 1 --prompt-bytes 230 --duration 20s --slice 1s --requests 10000000 --targets llmgw,nginx,haproxy
STALL = ./bin/llmgw bench overhead --engine llamacpp --nagle-stall --pin-targets 0 --pin-load 1 --prompt-bytes 230 --max-tokens 1 --mode closed --duration 20s --slice 1s --requests 10000000 --warmup 50 --targets llmgw,nginx-nokeepalive
bench-overhead: build
	@mkdir -p $(BENCH_OUT)
	$(FIXED) --mode closed --concurrency 32 --json $(BENCH_OUT)/overhead-fixed-c32.json
	$(FIXED) --mode closed --concurrency 256 --json $(BENCH_OUT)/overhead-fixed-c256.json
	$(FIXED) --mode open --rps 10000 --concurrency 256 --json $(BENCH_OUT)/overhead-fixed-open.json
	@for c in 1 4 8; do \
	  $(STALL) --concurrency $$c --json $(BENCH_OUT)/overhead-stall-c$$c.json && \
	  $(STALL) --concurrency $$c --keep-cpus-awake --json $(BENCH_OUT)/overhead-stall-c$$c-awake.json || exit 1; \
	done
	./bin/llmgw bench overhead --mode closed --concurrency 16 --stream --decode-per-token 200us --duration 10s --json $(BENCH_OUT)/overhead-stream.json

# bench-routing: `llmgw bench routing` over every workload and policy;
# JSON, Markdown and the PNG chart land in $(BENCH_OUT)/.
bench-routing: build
	./bin/llmgw bench routing --workload all --requests 800 --out $(BENCH_OUT)

# Reference proxies for the comparisons (Debian packages).
bench-deps:
	@command -v nginx >/dev/null && command -v haproxy >/dev/null && command -v etcd >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy etcd-server >/dev/null)

# fuzz runs every Fuzz target of the module for FUZZTIME each (default 60s).
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

clean:
	rm -rf bin

# report-deps: Debian's chromium for the HTML report's browser test
# (results/htmlreport; under CI=true it fails without it).
.PHONY: report-deps report-screenshots
report-deps:
	@command -v chromium >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# report-screenshots: a small results store (runbook converged in two
# modes, exact twice for a trend, and runbook pd, on simulators), its HTML report, and PNGs of the
# matrix and of one run page, in $(REPORT_OUT)/.
REPORT_OUT ?= /tmp/llmgw-report
report-screenshots: build
	rm -rf $(REPORT_OUT) && mkdir -p $(REPORT_OUT)
	./bin/llmgw runbook converged --out $(REPORT_OUT)/store --mode exact >/dev/null
	./bin/llmgw runbook converged --out $(REPORT_OUT)/store --mode exact >/dev/null
	./bin/llmgw runbook converged --out $(REPORT_OUT)/store --mode rr >/dev/null
	./bin/llmgw runbook pd --out $(REPORT_OUT)/store >/dev/null
	./bin/llmgw results report --out $(REPORT_OUT)/store --html $(REPORT_OUT)/site --all --bench results/htmlreport/testdata/bench
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,900 \
	  --screenshot=$(REPORT_OUT)/matrix.png file://$(abspath $(REPORT_OUT))/site/index.html
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,2400 \
	  --screenshot=$(REPORT_OUT)/run.png file://$$(ls -d $(abspath $(REPORT_OUT))/site/runs/*.html | head -1)
	@echo "wrote $(REPORT_OUT)/matrix.png and $(REPORT_OUT)/run.png (site: $(REPORT_OUT)/site/index.html)"

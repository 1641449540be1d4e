# llmgw — build, test and measure. `make test` is what CI runs (.ci/run).
GO        ?= go
PKGS      := ./...
RACE_PKGS := ./gateway/...
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME  ?= 60s

.PHONY: all build test unit lint fmt-check vet staticcheck bench bench-gateway fuzz clean

all: build

build:
	$(GO) build -o bin/llmgw ./cmd/llmgw

# test = lint + the default suite. Gateway packages run under the race
# detector; the rest run without it to keep the suite fast on 2 cores.
test: lint unit

unit:
	$(GO) test -race -count=1 $(RACE_PKGS)
	$(GO) test -count=1 $$($(GO) list $(PKGS) | grep -v '/gateway')

lint: fmt-check vet staticcheck

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) run $(STATICCHECK) $(PKGS)

# Benchmarks are never part of `make test`; results go to BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

bench-gateway:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 3s ./gateway/...

clean:
	rm -rf bin

# Admit's developer commands. `make help` lists them.
GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHCOUNT  ?= 3
FUZZTIME    ?= 30s

.PHONY: help deps test lint tidy-check ci proto bench bench-redis bench-rls bench-rls-peer bench-rlqs bench-ws bench-llm bench-fair bench-regions fuzz image pictures

IMAGE       ?= localhost/admit:latest
CONTAINER   ?= podman
# podman keeps HEALTHCHECK only in the docker image format.
IMAGEFLAGS  ?= $(if $(filter podman,$(CONTAINER)),--format docker,)

# PROTO_INCLUDE is where protoc finds Envoy's rls.proto and what it
# imports (envoyproxy/data-plane-api, cncf/xds, protoc-gen-validate and
# googleapis checkouts, or Limitador's limitador-server/vendor/protobufs/*).
PROTO_INCLUDE ?=

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ## install redis-server, redis-cli, chromium, podman, runc, promtool, nginx, caddy, haproxy and ip when missing (the tests start their own servers, browser, proxies and container)
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null && test -x /usr/bin/chromium && command -v podman >/dev/null && command -v runc >/dev/null && command -v promtool >/dev/null \
		&& test -x /usr/sbin/nginx && command -v caddy >/dev/null && test -x /usr/sbin/haproxy && test -x /usr/sbin/ip || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server redis-tools chromium podman runc prometheus nginx caddy haproxy iproute2 >/dev/null; }
	@redis-server --version
	@/usr/bin/chromium --version
	@podman --version
	@/usr/sbin/nginx -v 2>&1; caddy version; /usr/sbin/haproxy -v | head -1

test: deps ## run every test with the race detector, in shuffled order; then the demo page in headless Chromium and the container image (a line per package as it finishes, the slowest tests at the end)
	@$(GO) build -o .testlines ./internal/testlines
	bash -o pipefail -c '$(GO) test -race -shuffle=on -count=1 -timeout=20m -json ./... | ./.testlines'
	bash -o pipefail -c 'cd e2e && $(GO) test -count=1 -timeout=15m -json ./... | ../.testlines'


lint: ## gofmt, go vet and staticcheck over both modules
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt: the files above need formatting'; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd bench && $(GO) vet ./...
	cd e2e && $(GO) vet ./...

tidy-check: ## fail if go.mod or go.sum would change under go mod tidy
	$(GO) mod tidy -diff
	cd bench && $(GO) mod tidy -diff
	cd e2e && $(GO) mod tidy -diff

ci: tidy-check lint test ## everything CI runs

bench: ## comparison benchmarks against peer libraries (bench/ module)
	cd bench && $(GO) test -run='^$$' -bench=. -benchmem -count=$(BENCHCOUNT) -timeout=60m ./...
	cd bench && $(GO) run ./loadgen -callers 64 -duration 3s -rounds 5

bench-rls: deps ## the Envoy rate limit service vs a do-nothing gRPC server, memory and Redis (docs/benchmarks.md)
	cd bench && $(GO) run ./rlsbench -callers 64 -duration 3s -rounds 3
	cd bench && $(GO) run ./rlsbench -store redis -callers 64 -duration 3s -rounds 3

bench-rls-peer: deps ## envoyproxy/ratelimit, admit ratelimit and admit serve on one Redis, side by side (docs/benchmarks.md)
	cd bench && $(GO) run ./rlspeer -three -callers 64 -duration 3s -rounds 5 -memory 300000

bench-rlqs: deps ## the Envoy quota service vs the rate limit service on the same limits: server (and redis-server) CPU per decision, memory and Redis (docs/benchmarks.md)
	cd bench && $(GO) run ./rlqsbench -duration 5s -rounds 3
	cd bench && $(GO) run ./rlqsbench -store redis -duration 5s -rounds 3

bench-regions: deps ## one limit across three regions 40 ms from their home (Toxiproxy): admitted vs an exact bucket, over-admission, home calls, latency; 30 s a scenario (docs/benchmarks.md)
	cd e2e && ADMIT_BENCH_REGIONS=1 $(GO) test -count=1 -run TestBenchRegions -v -timeout 30m .

bench-fair: deps ## the limits tenants share, through two admit serve on one Redis: what each tenant gets, 60 s a scenario (docs/security.md, "Shared limits"); about 10 minutes
	cd bench && $(GO) run ./fairbench -duration 60s

bench-llm: ## admit proxy's LLM metering vs plain admit proxy: CPU per call, delay per streamed chunk, memory of a 100 MB stream (docs/benchmarks.md)
	cd bench && $(GO) run ./llmbench -callers 32 -duration 3s -rounds 5

bench-ws: ## the WebSocket gateway of admit serve: admissions/s, memory per idle connection, echoes/s per route (docs/benchmarks.md)
	cd bench && $(GO) run ./wsbench -duration 3s -rounds 3

bench-redis: deps ## the Redis store vs redis_rate and redis-benchmark (docs/benchmarks.md); about 5 minutes
	cd bench && ADMIT_REDIS_BENCH=1 $(GO) test -run TestRedisReport -count=1 -v -timeout=30m .

fuzz: ## run each fuzz target for 30s (FUZZTIME=10m for the long run)
	$(GO) test -run='^$$' -fuzz=FuzzKey -fuzztime=$(FUZZTIME) .
	$(GO) test -run='^$$' -fuzz=FuzzBucket -fuzztime=$(FUZZTIME) ./internal/engine
	$(GO) test -run='^$$' -fuzz=FuzzWindows -fuzztime=$(FUZZTIME) ./internal/engine
	$(GO) test -run='^$$' -fuzz=FuzzShare -fuzztime=$(FUZZTIME) ./internal/engine
	$(GO) test -run='^$$' -fuzz=FuzzKthExpiry -fuzztime=$(FUZZTIME) ./internal/engine
	$(GO) test -run='^$$' -fuzz=FuzzQuota -fuzztime=$(FUZZTIME) ./internal/engine
	$(GO) test -run='^$$' -fuzz=FuzzParseRate -fuzztime=$(FUZZTIME) .
	$(GO) test -run='^$$' -fuzz=FuzzRedact -fuzztime=$(FUZZTIME) ./redisstore
	$(GO) test -run='^$$' -fuzz=FuzzUsageScan -fuzztime=$(FUZZTIME) ./llm
	$(GO) test -run='^$$' -fuzz=FuzzTopFields -fuzztime=$(FUZZTIME) ./llm
	$(GO) test -run='^$$' -fuzz=FuzzCheckBody -fuzztime=$(FUZZTIME) ./internal/server
	$(GO) test -run='^$$' -fuzz=FuzzParseConfig -fuzztime=$(FUZZTIME) ./cmd/admit
	$(GO) test -run='^$$' -fuzz=FuzzParse$$ -fuzztime=$(FUZZTIME) ./envoyrls
	$(GO) test -run='^$$' -fuzz=FuzzParseFiles -fuzztime=$(FUZZTIME) ./envoyrls
	$(GO) test -run='^$$' -fuzz=FuzzShouldRateLimit -fuzztime=$(FUZZTIME) ./envoyrls
	$(GO) test -run='^$$' -fuzz=FuzzFrame -fuzztime=$(FUZZTIME) ./wsgateway
	$(GO) test -run='^$$' -fuzz=FuzzQuery -fuzztime=$(FUZZTIME) ./wsgateway
	$(GO) test -run='^$$' -fuzz=FuzzAdminBody -fuzztime=$(FUZZTIME) ./internal/server
	$(GO) test -run='^$$' -fuzz=FuzzDuplicateKey -fuzztime=$(FUZZTIME) ./internal/httpx
	$(GO) test -run='^$$' -fuzz=FuzzForwardingHeaders -fuzztime=$(FUZZTIME) ./httplimit
	$(GO) test -run='^$$' -fuzz=FuzzCheck$$ -fuzztime=$(FUZZTIME) ./httplimit
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./simulate
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./limitador
	$(GO) test -run='^$$' -fuzz=FuzzDecide -fuzztime=$(FUZZTIME) ./limitador
	$(GO) test -run='^$$' -fuzz=FuzzEntryForms -fuzztime=$(FUZZTIME) ./limitador

pictures: ## redraw docs/img/seed004.png (README) with admit simulate
	$(GO) run ./cmd/admit simulate --independent --pattern 'bursts n=2 every=1s' \
		--rule 'fixed_window limit=5 window=5s name=fixed-window' \
		--rule 'sliding_log limit=5 window=5s name=sliding-log' \
		--rule 'token_bucket rate=2/2s burst=5 name=token-bucket' \
		--out docs/img/seed004.png

image: ## build the container image (deploy/container/Containerfile) with podman, nothing pulled: IMAGE=…, CONTAINER=docker
	@ctx=$$(mktemp -d) && trap 'rm -rf "$$ctx"' EXIT && \
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=true -ldflags "-s -w -X main.version=$$(git describe --tags --always --dirty 2>/dev/null || echo devel)" -o "$$ctx/admit" ./cmd/admit && \
	cp deploy/container/passwd deploy/container/group /etc/ssl/certs/ca-certificates.crt "$$ctx/" && \
	mkdir "$$ctx/bin" && ln -s /admit "$$ctx/bin/ratelimit" && \
	$(CONTAINER) build -q $(IMAGEFLAGS) -t $(IMAGE) -f deploy/container/Containerfile "$$ctx"

proto: ## regenerate limitador/kuadrantpb from its .proto (protoc, protoc-gen-go, protoc-gen-go-grpc; PROTO_INCLUDE="-I dir …" for Envoy's protos)
	cd limitador/kuadrantpb && protoc -I . $(PROTO_INCLUDE) \
		--go_out=. --go_opt=paths=source_relative --go_opt=Menvoy/service/ratelimit/v3/rls.proto=github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3 \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative --go-grpc_opt=Menvoy/service/ratelimit/v3/rls.proto=github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3 \
		kuadrantrls.proto

# curia's front door. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# Tools, pinned. Each is installed with `go install`, outside go.work (buf
# would drag its pre-release protobuf into every service), into a directory of
# its own keyed by its own version: the binary is the rule's sentinel, so
# bumping one version reinstalls that tool only, and checkouts pinning other
# versions share the cache without clashing. golangci-lint is keyed by the Go
# version too: it refuses code whose go directive is newer than the Go it was
# built with. CI points TOOLS_CACHE at a cache that survives clones.
BUF_VERSION                   := v1.75.0
PROTOC_GEN_GO_VERSION         := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION    := v1.6.2
PROTOC_GEN_CONNECT_GO_VERSION := v1.21.1
GRPCURL_VERSION               := v1.9.4
GOLANGCI_LINT_VERSION         := v2.15.0
GOTESTSUM_VERSION             := v1.13.0
TOOLS_CACHE ?= $(CURDIR)/.bin
BUF                   := $(TOOLS_CACHE)/buf/$(BUF_VERSION)/buf
PROTOC_GEN_GO         := $(TOOLS_CACHE)/protoc-gen-go/$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC    := $(TOOLS_CACHE)/protoc-gen-go-grpc/$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc
PROTOC_GEN_CONNECT_GO := $(TOOLS_CACHE)/protoc-gen-connect-go/$(PROTOC_GEN_CONNECT_GO_VERSION)/protoc-gen-connect-go
GRPCURL               := $(TOOLS_CACHE)/grpcurl/$(GRPCURL_VERSION)/grpcurl
GOLANGCI_LINT         := $(TOOLS_CACHE)/golangci-lint/$(GOLANGCI_LINT_VERSION)-$(shell go env GOVERSION)/golangci-lint
GOTESTSUM             := $(TOOLS_CACHE)/gotestsum/$(GOTESTSUM_VERSION)/gotestsum
TOOL_BINS := $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(PROTOC_GEN_CONNECT_GO) $(GRPCURL) $(GOLANGCI_LINT) $(GOTESTSUM)
# buf finds its local plugins (buf.gen.yaml) on PATH.
empty :=
space := $(empty) $(empty)
export PATH := $(subst $(space),:,$(strip $(foreach t,$(TOOL_BINS),$(dir $(t))))):$(PATH)
# go install GOBIN=<dir of the sentinel> <package>@<version> [flags...]
go_install = mkdir -p $(dir $@) && cd / && GOWORK=off GOBIN=$(dir $@) go install $(3) $(1)@$(2)

# Go modules of the workspace (go.work); `go ... work` means all of them.
MODULES := gen platform services/consensus services/curator services/reconciler services/roleserve services/dashboard deploy/local deploy/faults deploy/kubernetes
# What golangci-lint analyses: every module but gen/ (buf writes it), as
# ./<module>/... patterns, which go.work resolves from the root (a bare ./...
# does not: the root is no module).
LINT_PACKAGES := $(foreach m,$(filter-out gen,$(MODULES)),./$(m)/...)
# Binaries that `make build` produces, static, for FROM scratch images (the
# compose and Kubernetes image: deploy/kubernetes's test checks that every
# command its manifests run is one of them).
CMDS    := services/consensus/cmd/consensus services/curator/cmd/curator services/reconciler/cmd/reconciler services/roleserve/cmd/roleserve platform/cmd/curia-pki platform/cmd/curia-probe platform/cmd/curiactl platform/cmd/curia-s3 services/dashboard/cmd/curia-dashboard deploy/local/cmd/curia-local deploy/kubernetes/cmd/curia-kube
BIN     := $(CURDIR)/bin

# protovalidate's rules (buf/validate/validate.proto), which our protos
# import: never copied into the repository, but taken from the Go module
# cache at this version (downloaded by the go command like any module) and
# linked where buf.yaml's second module expects it. It must match the Go
# code of that proto, buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go
# in gen/go.mod, which buf.build/go/protovalidate (platform/go.mod) checks
# requests with.
PROTOVALIDATE_VERSION := v1.2.2
PROTOVALIDATE_LINK    := .buf-deps/protovalidate

# Where buf breaking compares the protos to: a git ref, in buf's form
# (.git#branch=<ref>, .git#ref=<ref>) or plain. The ref is checked out into
# a temporary directory with the same third-party protos linked: buf's own
# git input would lack them (they are not in git).
BREAKING_AGAINST ?= main
HASH             := \#
BREAKING_REF      = $(subst .git$(HASH)ref=,,$(subst .git$(HASH)branch=,,$(BREAKING_AGAINST)))

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: tools
tools: $(TOOL_BINS) ## install the pinned tools

$(BUF):
	$(call go_install,github.com/bufbuild/buf/cmd/buf,$(BUF_VERSION))

$(PROTOC_GEN_GO):
	$(call go_install,google.golang.org/protobuf/cmd/protoc-gen-go,$(PROTOC_GEN_GO_VERSION))

$(PROTOC_GEN_GO_GRPC):
	$(call go_install,google.golang.org/grpc/cmd/protoc-gen-go-grpc,$(PROTOC_GEN_GO_GRPC_VERSION))

$(PROTOC_GEN_CONNECT_GO):
	$(call go_install,connectrpc.com/connect/cmd/protoc-gen-connect-go,$(PROTOC_GEN_CONNECT_GO_VERSION))

$(GRPCURL):
	$(call go_install,github.com/fullstorydev/grpcurl/cmd/grpcurl,$(GRPCURL_VERSION),-ldflags "-X main.version=$(GRPCURL_VERSION)")

$(GOLANGCI_LINT):
	$(call go_install,github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))

$(GOTESTSUM):
	$(call go_install,gotest.tools/gotestsum,$(GOTESTSUM_VERSION))

.PHONY: proto-deps
proto-deps: ## link the third-party protos buf imports (protovalidate) from the Go module cache
	@dir=$$(cd / && GOWORK=off GOFLAGS=-mod=mod go mod download -json github.com/bufbuild/protovalidate@$(PROTOVALIDATE_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	test -f "$$dir/proto/protovalidate/buf/validate/validate.proto" || { echo "proto-deps: no buf/validate/validate.proto in github.com/bufbuild/protovalidate@$(PROTOVALIDATE_VERSION) ($$dir)" >&2; exit 1; }; \
	mkdir -p $(dir $(PROTOVALIDATE_LINK)) && ln -sfn "$$dir/proto/protovalidate" $(PROTOVALIDATE_LINK)

.PHONY: generate
generate: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(PROTOC_GEN_CONNECT_GO) proto-deps ## regenerate gen/ from proto/
	rm -rf gen/curia
	buf generate

.PHONY: check-generate
check-generate: generate ## regenerate and fail if gen/ differs from what is committed
	@if [ -n "$$(git status --porcelain -- gen)" ]; then \
		git status --porcelain -- gen; git diff --stat -- gen; \
		echo "gen/ is stale: run 'make generate' and commit the result" >&2; exit 1; fi

.PHONY: lint
lint: $(BUF) $(GOLANGCI_LINT) proto-deps ## gofmt, golangci-lint (.golangci.yml), buf lint and buf format
	@bad=$$(gofmt -l $(MODULES)); if [ -n "$$bad" ]; then echo "gofmt needed:" $$bad >&2; exit 1; fi
	golangci-lint run $(LINT_PACKAGES)
	@# The one file behind the failpoints tag (the binaries tests run).
	golangci-lint run --build-tags failpoints ./platform/failpoint/...
	buf lint
	buf format -d --exit-code

.PHONY: breaking
breaking: $(BUF) proto-deps ## buf breaking against main (BREAKING_AGAINST=<git ref>; CI: HEAD~1)
	@against=$$(mktemp -d); trap 'rm -rf "$$against"' EXIT; \
	git archive --format=tar '$(BREAKING_REF)' | tar -x -C "$$against"; \
	mkdir -p "$$against/$(dir $(PROTOVALIDATE_LINK))"; \
	ln -sfn "$$(readlink -f $(PROTOVALIDATE_LINK))" "$$against/$(PROTOVALIDATE_LINK)"; \
	(cd "$$against" && buf build proto -o "$$against/image.binpb"); \
	buf breaking proto --against "$$against/image.binpb"

.PHONY: check-files
check-files: ## fail if git tracks a build output (an executable or a file over 1 MB not in .ci/allowed-files)
	@bash .ci/check-files

.PHONY: check-alerts
# promtool: Debian's prometheus package (.ci/run installs it when missing).
OBSERVABILITY := deploy/observability
check-alerts: ## check the alerts of deploy/observability with promtool: rules.yaml, the PrometheusRule in step with it, rules_test.yaml
	@command -v promtool >/dev/null || { echo "check-alerts: no promtool: apt-get install --no-install-recommends prometheus" >&2; exit 1; }
	promtool check rules $(OBSERVABILITY)/rules.yaml
	@diff -u <(sed -n '/^groups:/,$$p' $(OBSERVABILITY)/rules.yaml | sed 's/^./  &/') <(sed -n '/^  groups:/,$$p' $(OBSERVABILITY)/prometheusrule.yaml) \
		|| { echo "check-alerts: prometheusrule.yaml's spec is not rules.yaml's groups (indented by two): edit both" >&2; exit 1; }
	cd $(OBSERVABILITY) && promtool test rules rules_test.yaml

.PHONY: check-tidy
check-tidy: ## fail if any module's go.mod/go.sum is not what `make tidy` makes
	@stale=; for m in $(MODULES); do \
		if ! diff=$$(cd $$m && GOWORK=off go mod tidy -diff 2>&1); then \
			echo "$$m: go.mod/go.sum stale:" >&2; echo "$$diff" >&2; stale="$$stale $$m"; fi; done; \
	if [ -n "$$stale" ]; then \
		echo "not tidy:$$stale: run 'make tidy' (or 'cd <module> && GOWORK=off go mod tidy') and commit" >&2; exit 1; fi

.PHONY: test
# With -cover: the profile goes to .cover/ (git-ignored), and curia-cover
# prints one line per module of go.work (its packages' statement coverage)
# and the total. The binaries the tests start as processes
# (platform/proctest) are built with -cover too (CURIA_COVERDIR) and write
# their counters to a fresh COVERDIR, which curia-cover adds in a second
# column. COVER= runs the same tests without either.
#
# TEST_P packages test at once (go test -p; go's default is the number of
# CPUs, ours at least 3): the services' packages run etcd members and
# processes and mostly wait for elections and leases, so on 2 cores the
# machine was 35-80 % idle while two of them ran; three at a time keep it
# busier and end about when the longest (the curator's, 5 minutes) does.
COVER        ?= 1
COVERPROFILE ?= $(CURDIR)/.cover/profile.out
COVERDIR     ?= $(CURDIR)/.cover/covdata
TEST_P       ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 3 ] && echo $$n || echo 3)
test: ## run every test (real etcd, real mTLS, loopback), with each module's statement coverage (COVER= without)
ifneq ($(COVER),)
	@mkdir -p $(dir $(COVERPROFILE)) && rm -rf '$(COVERDIR)' && mkdir -p '$(COVERDIR)'
	CURIA_COVERDIR='$(abspath $(COVERDIR))' go test -race -count=1 -timeout 15m -p $(TEST_P) -cover -coverprofile '$(COVERPROFILE)' work
	go run ./platform/cmd/curia-cover -covdata '$(COVERDIR)' '$(COVERPROFILE)' $(MODULES:%=curia.dev/%)
else
	go test -race -count=1 -timeout 15m -p $(TEST_P) work
endif

.PHONY: test-unit
# Tests that start processes or etcd skip themselves under -short
# (proctest.SkipShort); what is left runs in seconds.
test-unit: ## the fast tier: go test -short, no processes, no etcd (35 s on 2 cores with a warm build cache; about 5 min cold, most of it compiling)
	go test -short -count=1 -timeout 60s work

.PHONY: bench
# One table of every benchmark's metrics against the targets of
# platform/cmd/curia-bench/targets.go (the -count runs of a benchmark as
# median and min–max), written to bench/results.json too; go test's own
# output is kept in bench/raw.txt. pipefail (.SHELLFLAGS) fails the target
# when go test fails; curia-bench fails it too on a FAIL line.
#
# The scale benchmarks (services/curator: BenchmarkAgents, up to 10,000
# agents on a curator pair, and BenchmarkHeartbeatDesigns) run after the
# others, once each (SCALE_BENCHTIME=1x: a round is a 20 s window of steady
# state, after a ramp of up to 3 minutes and a settling of 15 s): about 15
# minutes on 2 cores, 5 of them for the 10,000 agents. SCALE picks their
# sub-benchmarks (SCALE=n=1k for the smallest fleet only, SCALE=none for
# none).
BENCHTIME       ?= 3x
BENCHCOUNT      ?= 1
BENCH_PACKAGES  := ./services/consensus/ ./services/curator/ ./services/reconciler/ ./services/dashboard/ ./deploy/local/
SCALE_BENCH     := ^(BenchmarkAgents|BenchmarkHeartbeatDesigns)$$
SCALE           ?= .
SCALE_BENCHTIME ?= 1x
bench: ## Go benchmarks as one table against the targets, also in bench/results.json (BENCHTIME=3x BENCHCOUNT=1 SCALE=.)
	@mkdir -p bench
	{ go test -run '^$$' -bench . -skip '$(SCALE_BENCH)' -benchtime $(BENCHTIME) -count $(BENCHCOUNT) $(BENCH_PACKAGES); \
	  go test -run '^$$' -bench '$(SCALE_BENCH)/$(SCALE)' -benchtime $(SCALE_BENCHTIME) -count $(BENCHCOUNT) -timeout 30m ./services/curator/; } 2>&1 \
		| tee bench/raw.txt | go run ./platform/cmd/curia-bench report -json bench/results.json \
			-benchtime '$(BENCHTIME)' -count '$(BENCHCOUNT)' -scale '$(SCALE)' -scale-benchtime '$(SCALE_BENCHTIME)'
	@echo "bench: run make bench-doc to refresh docs/operating/benchmarks.md from bench/results.json"

.PHONY: bench-doc
bench-doc: ## rewrite docs/operating/benchmarks.md's tables from bench/results.json
	go run ./platform/cmd/curia-bench doc -update docs/operating/benchmarks.md bench/results.json

.PHONY: bench-compare
# Keep a run to compare with: cp bench/results.json bench/old.json.
OLD ?= bench/old.json
bench-compare: ## change per metric from an earlier make bench to bench/results.json (OLD=bench/old.json)
	@test -f '$(OLD)' || { echo "bench-compare: no $(OLD): keep an earlier run (cp bench/results.json $(OLD)) or pass OLD=path.json" >&2; exit 1; }
	@test -f bench/results.json || { echo "bench-compare: no bench/results.json: run make bench first" >&2; exit 1; }
	go run ./platform/cmd/curia-bench compare '$(OLD)' bench/results.json

.PHONY: test-e2e
# Docker is asked here, not when the Makefile is read: with it the compose
# cluster's image is built and its test runs; without, that test skips.
test-e2e: test-e2e-process test-e2e-compose ## end-to-end tests: the process clusters (and every grpcurl command in the README and docs/operating/), and the compose cluster when Docker runs

.PHONY: test-e2e-process
# Each tier is its own go test, with its own timeout: together they take
# about 10 minutes on 2 cores (process 4, compose 5.5).
# gotestsum prints go test -v's output as it comes, then each failed test's
# output again at the end (=== Failed): the reason a sub-test failed is
# in the last lines of the log, not thousands of lines above them.
E2E_TEST = $(GOTESTSUM) --format standard-verbose --hide-summary=skipped -- -tags e2e -count=1
#
# The process tier's five cluster tests run side by side, three at a time:
# each has a cluster of its own on a loopback /24 of its own, and they
# mostly wait (the machine was 80-95 % idle while TestE2E ran alone on 2
# cores), so together they take about as long as the longest, TestE2E.
test-e2e-process: build $(GRPCURL) $(GOTESTSUM) ## end-to-end tests on process clusters: TestE2E, recovery, upgrades, curiactl, the dashboard
	$(E2E_TEST) -timeout 25m -parallel 3 -skip '^TestCompose$$' ./deploy/local/

.PHONY: test-e2e-compose
test-e2e-compose: build $(GRPCURL) $(GOTESTSUM) ## end-to-end test of the compose cluster (skips without Docker)
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory images; \
	else echo "test-e2e-compose: no Docker: the compose cluster test will skip"; fi
	$(E2E_TEST) -timeout 20m -run '^TestCompose$$' ./deploy/local/

.PHONY: test-faults
# FAULT_SEED (a number or random), FAULT_DURATION (default 3m),
# FAULT_NEMESES (comma-separated kinds) and FAULT_STRICT_RECONFIG (off by
# default: curia's quorum guard alone; on: etcd's checks too) for longer
# runs by hand.
test-faults: ## the fault suite: a cluster in network namespaces under kill, pause, partitions and membership faults (root)
	go test -tags faults -count=1 -timeout 90m -v -run 'TestFaults$$|TestRecoveryRefusedInPartition' ./deploy/faults/

.PHONY: test-mutations
# Each mutation of platform/failpoint/mutations.go with the test that must
# catch it (platform/cmd/curia-mutations has the catalog); a few minutes.
test-mutations: ## show each safety mechanism's test fails when the mechanism is switched off
	go run ./platform/cmd/curia-mutations

.PHONY: test-faults-mutations
test-faults-mutations: ## show the fault suite fails when a safety mechanism is switched off (root)
	go test -tags faults -count=1 -timeout 60m -v -run 'TestMutationsCaught' ./deploy/faults/

.PHONY: build
# Every binary carries VERSION (platform/version; `<binary> --version`).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo unknown)
build: ## static binaries into bin/, stamped with VERSION (default: git describe --always --dirty)
	@mkdir -p $(BIN)
	for c in $(CMDS); do CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -X curia.dev/platform/version.version=$(VERSION)' -o $(BIN)/$$(basename $$c) ./$$c; done

.PHONY: tidy
tidy: ## go mod tidy every module (each on its own, as CI's clean clone sees it)
	for m in $(MODULES); do (cd $$m && GOWORK=off go mod tidy); done

.PHONY: run
# The pinned grpcurl too: .curia/env puts its directory first on PATH, so
# the command printed at the end works in a fresh shell.
run: build $(GRPCURL) ## start a local cluster as processes (state in .curia; FRESH=1 starts over)
	$(BIN)/curia-local --state .curia --bin $(BIN) --grpcurl $(abspath $(GRPCURL)) $(if $(FRESH),--fresh)

.PHONY: upgrade
# With make run's cluster running: `make upgrade` rebuilds bin/ and restarts
# every process from it, one at a time (a rolling upgrade to this tree;
# unchanged binaries make it a rolling restart); TO=<dir> installs another
# build's binaries into bin/ first.
upgrade: build ## replace the running local cluster's processes one at a time, each node in maintenance (TO=<dir>: another build's binaries)
	$(BIN)/curia-local upgrade --state .curia --bin $(BIN) $(if $(TO),--to $(TO))

.PHONY: recover
recover: ## after a quorum loss of the local cluster: say what recovery would do; CONFIRM=<node> does it (SNAPSHOT=<file> restores a snapshot on that node instead)
	@test -x $(BIN)/curia-local || $(MAKE) --no-print-directory build
	$(BIN)/curia-local recover --state .curia $(if $(CONFIRM),--confirm $(CONFIRM)) $(if $(SNAPSHOT),--snapshot $(SNAPSHOT))

# The docker compose cluster (deploy/compose): one FROM scratch image of bin/,
# run with compose v2 (`docker compose`) or, where only that is installed,
# v1.29 (`docker-compose`).
COMPOSE     ?= $(shell docker compose version >/dev/null 2>&1 && echo 'docker compose' || echo docker-compose)
CURIA_IMAGE ?= curia:dev
COMPOSE_ENV := COMPOSE_FILE=$(CURDIR)/deploy/compose/compose.yaml COMPOSE_PROJECT_NAME=$${COMPOSE_PROJECT_NAME:-curia} CURIA_IMAGE=$(CURIA_IMAGE)

.PHONY: images
images: build ## the compose (and Kubernetes) image: FROM scratch + bin/ (CURIA_IMAGE=curia:dev)
	@for b in consensus curator reconciler roleserve curia-local curia-probe curia-kube; do \
		test -x $(BIN)/$$b || { echo "images: $(BIN)/$$b is missing (is it in CMDS?)" >&2; exit 1; }; done
	docker build -t $(CURIA_IMAGE) -f deploy/compose/Dockerfile $(BIN)

# make up's dashboard runs on the host, detached (curia-local dashboard, in
# deploy/compose/up.sh); make down stops it by its pid file in
# .curia-compose (CURIA_COMPOSE_OUT, as up.sh), before the cluster.
COMPOSE_OUT    = $${CURIA_COMPOSE_OUT:-.curia-compose}
STOP_DASHBOARD = if [ -x $(BIN)/curia-local ]; then $(BIN)/curia-local dashboard --stop --state $(COMPOSE_OUT); \
	elif [ -f $(COMPOSE_OUT)/dashboard.pid ]; then echo "no $(BIN)/curia-local (make build): the dashboard of $(COMPOSE_OUT)/dashboard.pid still runs" >&2; fi

.PHONY: up
up: images $(GRPCURL) ## start the compose cluster, wait until ready, write .curia-compose/env, start the dashboard (UP_ARGS="--scale curator=3")
	COMPOSE='$(COMPOSE)' CURIA_IMAGE=$(CURIA_IMAGE) CURIA_BIN=$(BIN) GRPCURL=$(abspath $(GRPCURL)) deploy/compose/up.sh $(UP_ARGS)

.PHONY: upgrade-compose
# With make up's cluster running: `make upgrade-compose` rebuilds the image
# and rolls every container onto it, one at a time, each node in
# maintenance (curia-local compose-upgrade), then runs up.sh for the env
# file and the dashboard (a recreated replica may publish another port).
# Pass the UP_ARGS the cluster was started with.
upgrade-compose: images $(GRPCURL) ## roll the running compose cluster onto the rebuilt image (CURIA_IMAGE), one container at a time
	$(COMPOSE_ENV) COMPOSE='$(COMPOSE)' $(BIN)/curia-local compose-upgrade --state $(COMPOSE_OUT) --image $(CURIA_IMAGE)
	COMPOSE='$(COMPOSE)' CURIA_IMAGE=$(CURIA_IMAGE) CURIA_BIN=$(BIN) GRPCURL=$(abspath $(GRPCURL)) deploy/compose/up.sh $(UP_ARGS)

.PHONY: down
down: ## stop the compose cluster and its dashboard; its volumes keep the data for the next `make up`
	$(STOP_DASHBOARD)
	$(COMPOSE_ENV) $(COMPOSE) down --remove-orphans

.PHONY: down-volumes
down-volumes: ## stop the compose cluster and its dashboard, delete its volumes and .curia-compose: the next `make up` starts over
	$(STOP_DASHBOARD)
	$(COMPOSE_ENV) $(COMPOSE) down --volumes --remove-orphans
	rm -rf .curia-compose

.PHONY: clean
clean: ## remove build output and the local cluster's state (.curia)
	rm -rf $(BIN) .curia

# curia's front door. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# Tools, pinned. They are installed with `go install` into a directory keyed
# by these versions, outside go.work (buf would drag its pre-release protobuf
# into every service). CI points TOOLS_CACHE at a cache that survives clones.
BUF_VERSION                  := v1.75.0
PROTOC_GEN_GO_VERSION        := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION   := v1.6.2
PROTOC_GEN_CONNECT_GO_VERSION := v1.21.1
GRPCURL_VERSION              := v1.9.4
TOOLS_CACHE ?= $(CURDIR)/.bin
TOOLS_KEY   := $(shell echo '$(BUF_VERSION) $(PROTOC_GEN_GO_VERSION) $(PROTOC_GEN_GO_GRPC_VERSION) $(PROTOC_GEN_CONNECT_GO_VERSION) $(GRPCURL_VERSION)' | sha256sum | cut -c1-12)
TOOLS       := $(TOOLS_CACHE)/$(TOOLS_KEY)
BUF         := $(TOOLS)/buf
GRPCURL     := $(TOOLS)/grpcurl
export PATH := $(TOOLS):$(PATH)

# Go modules of the workspace (go.work); `go ... work` means all of them.
MODULES := gen platform services/consensus services/curator services/reconciler services/roleserve deploy/local deploy/faults
# Binaries that `make build` produces, static, for FROM scratch images.
CMDS    := services/consensus/cmd/consensus services/curator/cmd/curator services/reconciler/cmd/reconciler services/roleserve/cmd/roleserve platform/cmd/curia-pki platform/cmd/curia-probe deploy/local/cmd/curia-local
BIN     := $(CURDIR)/bin

# Where buf breaking compares the protos to.
BREAKING_AGAINST ?= .git\#branch=main

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: tools
tools: $(BUF) $(GRPCURL) ## install the pinned tools

$(BUF):
	@mkdir -p $(TOOLS)
	cd / && GOWORK=off GOBIN=$(TOOLS) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	cd / && GOWORK=off GOBIN=$(TOOLS) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	cd / && GOWORK=off GOBIN=$(TOOLS) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	cd / && GOWORK=off GOBIN=$(TOOLS) go install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)

$(GRPCURL):
	@mkdir -p $(TOOLS)
	cd / && GOWORK=off GOBIN=$(TOOLS) go install -ldflags "-X main.version=$(GRPCURL_VERSION)" github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

.PHONY: generate
generate: $(BUF) ## regenerate gen/ from proto/
	rm -rf gen/curia
	buf generate

.PHONY: check-generate
check-generate: generate ## regenerate and fail if gen/ differs from what is committed
	@if [ -n "$$(git status --porcelain -- gen)" ]; then \
		git status --porcelain -- gen; git diff --stat -- gen; \
		echo "gen/ is stale: run 'make generate' and commit the result" >&2; exit 1; fi

.PHONY: lint
lint: $(BUF) ## gofmt, go vet and buf lint
	@bad=$$(gofmt -l $(MODULES)); if [ -n "$$bad" ]; then echo "gofmt needed:" $$bad >&2; exit 1; fi
	go vet work
	buf lint

.PHONY: breaking
breaking: $(BUF) ## buf breaking against main (BREAKING_AGAINST=...)
	buf breaking --against '$(BREAKING_AGAINST)'

.PHONY: test
test: ## run every test (real etcd, real mTLS, loopback)
	go test -race -count=1 -timeout 15m work

.PHONY: test-unit
# Tests that start processes or etcd skip themselves under -short
# (proctest.SkipShort); what is left runs in seconds.
test-unit: ## the fast tier: go test -short, no processes, no etcd (under 30s with a warm build cache)
	go test -short -count=1 -timeout 60s work

.PHONY: bench
bench: ## Go benchmarks (bootstrap-to-ready, join-to-voter, ...)
	go test -run '^$$' -bench . -benchtime 3x ./services/consensus/ ./services/curator/

.PHONY: test-e2e
# With Docker, the compose cluster is tested too (its image first).
DOCKER := $(shell docker info >/dev/null 2>&1 && echo yes)
test-e2e: build $(GRPCURL) $(if $(DOCKER),images) ## end-to-end tests: the process cluster (and every grpcurl command in the README), and the compose cluster when Docker runs
	go test -tags e2e -count=1 -timeout 20m -v ./deploy/local/

.PHONY: test-faults
# FAULT_SEED (a number or random), FAULT_DURATION (default 3m) and
# FAULT_NEMESES (comma-separated kinds) for longer runs by hand.
test-faults: ## the fault suite: a cluster in network namespaces under kill, pause, partitions and membership faults (root)
	go test -tags faults -count=1 -timeout 90m -v -run 'TestFaults$$' ./deploy/faults/

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
run: build ## start a local cluster as processes (state in .curia; FRESH=1 starts over)
	$(BIN)/curia-local --state .curia --bin $(BIN) $(if $(FRESH),--fresh)

# The docker compose cluster (deploy/compose): one FROM scratch image of bin/,
# run with compose v2 (`docker compose`) or, where only that is installed,
# v1.29 (`docker-compose`).
COMPOSE     ?= $(shell docker compose version >/dev/null 2>&1 && echo 'docker compose' || echo docker-compose)
CURIA_IMAGE ?= curia:dev
COMPOSE_ENV := COMPOSE_FILE=$(CURDIR)/deploy/compose/compose.yaml COMPOSE_PROJECT_NAME=$${COMPOSE_PROJECT_NAME:-curia} CURIA_IMAGE=$(CURIA_IMAGE)

.PHONY: images
images: build ## the compose cluster's image: FROM scratch + bin/ (CURIA_IMAGE=curia:dev)
	@for b in consensus curator reconciler roleserve curia-local curia-probe; do \
		test -x $(BIN)/$$b || { echo "images: $(BIN)/$$b is missing (is it in CMDS?)" >&2; exit 1; }; done
	docker build -t $(CURIA_IMAGE) -f deploy/compose/Dockerfile $(BIN)

.PHONY: up
up: images ## start the compose cluster, wait until ready, write .curia-compose/env (UP_ARGS="--scale curator=3")
	COMPOSE='$(COMPOSE)' CURIA_IMAGE=$(CURIA_IMAGE) GRPCURL=$(GRPCURL) deploy/compose/up.sh $(UP_ARGS)

.PHONY: down
down: ## stop the compose cluster; its volumes keep the data for the next `make up`
	$(COMPOSE_ENV) $(COMPOSE) down --remove-orphans

.PHONY: down-volumes
down-volumes: ## stop the compose cluster and delete its volumes and .curia-compose: the next `make up` starts over
	$(COMPOSE_ENV) $(COMPOSE) down --volumes --remove-orphans
	rm -rf .curia-compose

.PHONY: clean
clean: ## remove build output and the local cluster's state (.curia)
	rm -rf $(BIN) .curia

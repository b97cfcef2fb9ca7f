# The two set-up commands of README.md live here: `make demo` and `make test`.
GO ?= go

.PHONY: demo test build generate check bench

# Built, then run in the recipe's place: under `go run`, Ctrl-C reached the go
# command too, which then exited 1 after the demo's clean stop, and make said
# "Error 1".
demo: ## run the whole system on this machine (Ctrl-C stops and cleans up)
	$(GO) build -o bin/console ./cmd/console && exec ./bin/console demo

test: ## everything the tests need, then every test (real PostgreSQL, NATS, RabbitMQ, chromium)
	./scripts/test-deps
	$(GO) test -timeout 45m ./...

build:
	$(GO) build -o bin/console ./cmd/console

generate: ## regenerate templ components (commit the _templ.go files)
	$(GO) tool templ generate

check: ## what CI checks besides the tests
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

bench: ## the quick benchmark run (bench/run --quick; bench/run alone is the full one): ratios against same-run peers
	./bench/run --quick

package broker_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// brokerClients are the modules that only adapters, the embedded server and
// the programs that wire them may link.
var brokerClients = []string{
	"github.com/nats-io/nats-server",
	"github.com/nats-io/nats.go",
	"github.com/rabbitmq/amqp091-go",
}

// goList runs `go list -deps` with the toolchain that runs the test and
// returns the import paths, non-standard ones only.
func goList(t *testing.T, pkgs ...string) []string {
	t.Helper()
	args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, pkgs...)
	// A test binary runs where `go test` built it, so the build's GOROOT is
	// the toolchain running the test (PATH may hold another one, or none).
	//lint:ignore SA1019 the deprecation is about binaries copied elsewhere; test binaries are not
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Fields(string(out))
}

// Writing or applying an event never links a broker (STYLE 15): the domain
// packages depend on the contract, never on an adapter.
func TestDomainPackagesLinkNoBroker(t *testing.T) {
	t.Parallel()
	domain := []string{
		"github.com/sluice-dev/sluice/internal/outbox",
		"github.com/sluice-dev/sluice/internal/inbox",
		"github.com/sluice-dev/sluice/internal/payments",
	}
	deps := goList(t, domain...)
	if len(deps) < len(domain) {
		t.Fatalf("go list named %d packages for %d domain packages: %v", len(deps), len(domain), deps)
	}
	for _, dep := range deps {
		for _, client := range brokerClients {
			if dep == client || strings.HasPrefix(dep, client+"/") {
				t.Errorf("%s depend on %s (module %s): import the contract, internal/broker, and leave adapters to cmd/console and the demo", strings.Join(domain, ", "), dep, client)
			}
		}
	}
}

// The contract itself is standard library only.
func TestContractIsStandardLibraryOnly(t *testing.T) {
	t.Parallel()
	const contract = "github.com/sluice-dev/sluice/internal/broker"
	for _, dep := range goList(t, contract) {
		if dep != contract {
			t.Errorf("%s depends on %s; it may import the standard library only", contract, dep)
		}
	}
}

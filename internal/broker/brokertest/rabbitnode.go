package brokertest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitNode is a RabbitMQ node of one test's own, started from the
// machine's rabbitmq-server on free ports, for what must not touch the
// shared server every parallel test uses: a resource alarm blocks every
// publishing connection of its node.
type RabbitNode struct {
	URL  string // amqp://guest:guest@127.0.0.1:<port>/
	name string
	env  []string
}

// StartRabbitNode starts a node and stops it when t ends (about 10 s).
// rabbitmq-server must be installed (it is on this kind of machine) and the
// test run as root or as the rabbitmq user: the server's scripts run it as
// that user. Anything missing fails the test with the reason.
func StartRabbitNode(t *testing.T) *RabbitNode {
	t.Helper()
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		t.Fatalf("rabbitmq-server is not installed (apt-get install -y rabbitmq-server): %v", err)
	}
	// The node runs as the rabbitmq user (the server's scripts switch to it
	// from root), so its directory is created open to it.
	dir, err := os.MkdirTemp("", "sluice-rabbit-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	amqpPort, distPort := freePort(t), freePort(t)
	conf := filepath.Join(dir, "rabbitmq.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\n", amqpPort)), 0o644); err != nil {
		t.Fatal(err)
	}
	plugins := filepath.Join(dir, "enabled_plugins")
	if err := os.WriteFile(plugins, []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &RabbitNode{
		URL:  fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort),
		name: fmt.Sprintf("sluicetest%d-%d@localhost", os.Getpid(), amqpPort),
	}
	n.env = append(os.Environ(),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_CONFIG_FILE="+conf,
		"RABBITMQ_ENABLED_PLUGINS_FILE="+plugins,
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", amqpPort),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
	)
	start := exec.Command("rabbitmq-server", "-detached")
	start.Env = n.env
	if out, err := start.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("start a RabbitMQ node of the test's own (as root or the rabbitmq user): %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// shutdown, not stop: it returns once the node's process is gone.
		if out, err := n.ctl("shutdown"); err != nil {
			t.Logf("stop the test's RabbitMQ node %s: %v\n%s", n.name, err, out)
		}
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		conn, err := amqp.Dial(n.URL)
		if err == nil {
			conn.Close()
			return n
		}
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(filepath.Join(dir, "log", n.name+".log"))
			t.Fatalf("the test's RabbitMQ node did not answer on %s within 90 s: %v\n%s", n.URL, err, tail(string(logs), 40))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Alarm sets (true) or clears the node's memory alarm, which blocks every
// publishing connection while it lasts (connection.blocked), as a node
// short of memory or disk does.
func (n *RabbitNode) Alarm(t *testing.T, on bool) {
	t.Helper()
	watermark := []string{"set_vm_memory_high_watermark", "0.4"}
	if on {
		watermark = []string{"set_vm_memory_high_watermark", "absolute", "1"}
	}
	if out, err := n.ctl(watermark...); err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(watermark, " "), err, out)
	}
	// The memory monitor raises or clears the alarm on its own schedule:
	// wait until the node says it has (check_alarms fails while one is on).
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := n.tool("rabbitmq-diagnostics", "check_alarms")
		if (err != nil) == on {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's memory alarm is not %v a minute after rabbitmqctl set it: %v\n%s", on, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *RabbitNode) ctl(args ...string) ([]byte, error) { return n.tool("rabbitmqctl", args...) }

func (n *RabbitNode) tool(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, append([]string{"-n", n.name}, args...)...)
	cmd.Env = n.env
	return cmd.CombinedOutput()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

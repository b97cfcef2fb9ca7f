package db

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// Cluster is a throwaway PostgreSQL server in a temporary folder, for the demo
// and for tests on a machine where no server answers. Stop removes it.
type Cluster struct {
	dir  string // temporary folder holding data/ and the log
	bin  string // folder with initdb, pg_ctl, postgres
	port int
	cred *syscall.Credential // the unprivileged user the server runs as (nil: ourselves)
}

// ErrNoServerBinaries says what to install when no PostgreSQL is available.
var ErrNoServerBinaries = errors.New("no PostgreSQL server binaries found (initdb, pg_ctl): install them with `apt-get install -y postgresql` or set DATABASE_URL / TEST_DATABASE_URL to a running PostgreSQL ≥ 15")

// FindServerBinaries returns the folder holding initdb and pg_ctl: from PATH
// (following symlinks) or the newest /usr/lib/postgresql/*/bin.
func FindServerBinaries() (string, error) {
	var candidates []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(found, func(i, j int) bool { return versionOf(found[i]) > versionOf(found[j]) })
	candidates = append(candidates, found...)
	for _, dir := range candidates {
		if isExec(filepath.Join(dir, "initdb")) && isExec(filepath.Join(dir, "pg_ctl")) && isExec(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", ErrNoServerBinaries
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// StartCluster initialises and starts a new cluster listening on 127.0.0.1 on
// a free port. initdb refuses to run as root, so when we are root the server
// runs as the `postgres` system user in a folder that user owns.
func StartCluster(ctx context.Context) (*Cluster, error) {
	bin, err := FindServerBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		return nil, fmt.Errorf("temporary cluster folder: %w", err)
	}
	c := &Cluster{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		cred, err := unprivilegedUser()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		c.cred = cred
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("hand the cluster folder to the postgres user: %w", err)
		}
	}
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func unprivilegedUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and initdb refuses root: need the `postgres` system user to run the throwaway cluster (apt-get install -y postgresql creates it): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (c *Cluster) start(ctx context.Context) error {
	data := filepath.Join(c.dir, "data")
	if out, err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C"); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	// A throwaway cluster trades durability for speed; it is deleted at
	// exit. fsync off loses nothing when PostgreSQL alone stops (the
	// operating system still holds what it wrote), only when the machine
	// does. Commits stay synchronous: with them off, a commit already
	// acknowledged (a payment answered, an inbox row whose message the
	// consumer then acknowledged to the broker) vanished when the cluster
	// was stopped with -m immediate, and an outage drill lost two effects.
	opts := "-c listen_addresses=127.0.0.1 -c unix_socket_directories=" + c.dir +
		" -c fsync=off -c full_page_writes=off -c max_connections=300"
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.port = port
		out, err := c.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(c.dir, "postgres.log"), "-w", "-t", "60",
			"-o", fmt.Sprintf("-p %d %s", port, opts), "start")
		if err == nil {
			return nil
		}
		log, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
		if !bytes.Contains(log, []byte("could not bind")) {
			return fmt.Errorf("pg_ctl start: %w: %s %s", err, out, tail(log))
		}
	}
	return errors.New("pg_ctl start: no free port after 5 tries")
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	// Keep the server out of our process group, so Ctrl-C reaches us first
	// and we stop it cleanly.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	return cmd.CombinedOutput()
}

// URL is the connection URL of the cluster's `postgres` database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Dir is the cluster's temporary folder.
func (c *Cluster) Dir() string { return c.dir }

// Stop shuts the server down and removes its folder.
func (c *Cluster) Stop() error {
	var err error
	if _, statErr := os.Stat(filepath.Join(c.dir, "data", "postmaster.pid")); statErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, stopErr := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "fast", "-w", "stop")
		cancel()
		if stopErr != nil {
			err = fmt.Errorf("pg_ctl stop: %w: %s", stopErr, out)
		}
	}
	return errors.Join(err, os.RemoveAll(c.dir))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte) []byte {
	if len(b) > 2000 {
		return b[len(b)-2000:]
	}
	return b
}

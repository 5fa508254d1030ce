package compat

// Shared plumbing for the pgx compatibility suite: connection settings from
// the environment, schema setup, bounded contexts and failure collection.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// opTimeout bounds every single database round trip of the suite.
	opTimeout = 10 * time.Second
	// schema holds the suite's shared tables; per-worker schemas for the
	// search_path scenario are named spSchema(i).
	schema = "compat_go"
	// spWorkers is the number of workers (and schemas) of the SET scenario.
	spWorkers = 12
)

// dsn is where the suite connects (sluice, or PostgreSQL with
// SLUICE_COMPAT_TARGET=direct). Empty means "from the PG* variables".
var dsn = os.Getenv("COMPAT_DSN")

func spSchema(i int) string { return fmt.Sprintf("compat_go_sp_%d", i) }

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "compat/go setup failed: %v\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// setup (re)creates the suite's schemas. Exec without arguments uses the
// simple protocol, so this does not depend on prepared statements.
func setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	var b strings.Builder
	fmt.Fprintf(&b, "drop schema if exists %s cascade;\n", schema)
	fmt.Fprintf(&b, "create schema %s;\n", schema)
	for _, ddl := range []string{
		"create table %s.load (worker int not null, n int not null)",
		"create table %s.prep (worker int not null, n int not null)",
		"create table %s.uniq (k int primary key, worker int not null, note text not null)",
		"insert into %s.uniq values (0, -1, 'seed')",
		"create table %s.batch (worker int not null, n int not null)",
		"create table %s.copy_bin (id int primary key, name text not null, amount bigint not null, tags text[] not null)",
		"create table %s.copy_text (id int primary key, line text not null)",
		"create table %s.restart_log (worker int not null, n int not null)",
	} {
		fmt.Fprintf(&b, ddl+";\n", schema)
	}
	for i := 0; i < spWorkers; i++ {
		s := spSchema(i)
		fmt.Fprintf(&b, "drop schema if exists %s cascade; create schema %s;\n", s, s)
		fmt.Fprintf(&b, "create table %s.whoami (name text not null); insert into %s.whoami values ('%s');\n", s, s, s)
	}
	if _, err := conn.Exec(ctx, b.String()); err != nil {
		return fmt.Errorf("create schemas: %w", err)
	}
	return nil
}

// opCtx is a context for one round trip (or a short sequence of them).
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// connect opens a dedicated connection with the driver's default settings.
func connect() (*pgx.Conn, error) {
	ctx, cancel := opCtx()
	defer cancel()
	return pgx.Connect(ctx, dsn)
}

// newPool opens a pgxpool with default settings except its size.
func newPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return newPoolWith(t, maxConns, nil)
}

// newPoolWith is newPool with a hook to adjust the configuration (used only
// to attach a tracer or as a scenario says).
func newPoolWith(t *testing.T, maxConns int32, adjust func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse pool config: %v", err)
	}
	cfg.MaxConns = maxConns
	if adjust != nil {
		adjust(cfg)
	}
	ctx, cancel := opCtx()
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("create pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// directConnect opens an out-of-band connection to PostgreSQL itself.
func directConnect() (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(os.Getenv("COMPAT_DIRECT_PORT"))
	if err != nil {
		return nil, fmt.Errorf("COMPAT_DIRECT_PORT: %w", err)
	}
	cfg.Port = uint16(port)
	ctx, cancel := opCtx()
	defer cancel()
	return pgx.ConnectConfig(ctx, cfg)
}

// sqlState returns the SQLSTATE of err, or "" if it is not a server error.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// failures collects worker failures; identical messages are counted once.
type failures struct {
	mu     sync.Mutex
	total  int
	counts map[string]int
	order  []string
}

func (f *failures) add(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	f.total++
	if f.counts[msg] == 0 {
		f.order = append(f.order, msg)
	}
	f.counts[msg]++
}

func (f *failures) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}

// report fails the test with every distinct message (at most 15).
func (f *failures) report(t *testing.T, what string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.total == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d failure(s):", what, f.total)
	for i, msg := range f.order {
		if i == 15 {
			fmt.Fprintf(&b, "\n  ... and %d more distinct messages", len(f.order)-15)
			break
		}
		fmt.Fprintf(&b, "\n  [%dx] %s", f.counts[msg], msg)
	}
	t.Error(b.String())
}

// runWorkers runs fn(i) for i in [0, n) concurrently and waits, but never
// longer than limit (the workers themselves are bounded by opTimeout).
func runWorkers(t *testing.T, n int, limit time.Duration, fn func(i int)) {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			fn(i)
		}(i)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("workers did not finish within %v", limit)
	}
}

// sortedKeys is for readable messages.
func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

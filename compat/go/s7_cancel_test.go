package compat

// Scenario 7: cancellation.
//
//   - PgConn.CancelRequest (pgx's cancel API, a CancelRequest on a new
//     socket) while the connection runs pg_sleep(30): simple protocol,
//     extended protocol (cached statement) and inside a transaction. Each
//     ends within seconds with SQLSTATE 57014 and the same connection works
//     afterwards.
//   - context cancellation with pgconn.CancelRequestContextWatcherHandler,
//     pgx's documented way to make a cancelled context send a CancelRequest
//     (the scenario asks for cancellation through the driver's cancel API;
//     this is the only setting changed from the defaults): 57014 and the
//     connection survives.
//   - context cancellation with the default handler (pgx v5.6+ sets a
//     deadline on the socket): the call returns at once with a timeout
//     error, pgx closes the connection, sending a CancelRequest and
//     Terminate in the background; the abandoned query must end on the
//     server and the pooler stay usable for everyone else.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

const cancelLimit = 8 * time.Second

func TestS7CancelRequest(t *testing.T) {
	conn, err := connect()
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer func() {
		ctx, cancel := opCtx()
		defer cancel()
		conn.Close(ctx)
	}()

	cases := []struct {
		name string
		run  func(ctx context.Context) error
	}{
		{"simple protocol", func(ctx context.Context) error {
			_, err := conn.Exec(ctx, "select pg_sleep(30)")
			return err
		}},
		{"extended protocol", func(ctx context.Context) error {
			var s string
			return conn.QueryRow(ctx, "select pg_sleep($1)::text", 30.0).Scan(&s)
		}},
		{"in a transaction", func(ctx context.Context) error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return fmt.Errorf("begin: %w", err)
			}
			defer tx.Rollback(ctx)
			var n int
			if err := tx.QueryRow(ctx, "select $1::int", 5).Scan(&n); err != nil || n != 5 {
				return fmt.Errorf("query before the sleep: %d, %w", n, err)
			}
			_, err = tx.Exec(ctx, "select pg_sleep($1)", 30.0)
			if err == nil {
				return nil
			}
			// The transaction is aborted: ROLLBACK must work.
			if rbErr := tx.Rollback(ctx); rbErr != nil {
				return fmt.Errorf("%w; then rollback failed: %v", err, rbErr)
			}
			return err
		}},
	}
	for _, tc := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cancelErr := make(chan error, 1)
		go func() {
			time.Sleep(time.Second)
			cctx, ccancel := opCtx()
			defer ccancel()
			cancelErr <- conn.PgConn().CancelRequest(cctx)
		}()
		start := time.Now()
		err := tc.run(ctx)
		elapsed := time.Since(start)
		cancel()
		if cerr := <-cancelErr; cerr != nil {
			t.Errorf("%s: CancelRequest: %v", tc.name, cerr)
		}
		if sqlState(err) != "57014" {
			t.Errorf("%s: want SQLSTATE 57014, got %v (after %v)", tc.name, err, elapsed.Round(time.Millisecond))
		} else if elapsed > cancelLimit {
			t.Errorf("%s: cancelled only after %v", tc.name, elapsed.Round(time.Millisecond))
		}
		if msg := checkConnWorks(conn); msg != "" {
			t.Errorf("%s: the connection does not work after the cancel: %s", tc.name, msg)
		}
		t.Logf("%s: cancelled after %v", tc.name, elapsed.Round(time.Millisecond))
	}
}

func checkConnWorks(conn *pgx.Conn) string {
	ctx, cancel := opCtx()
	defer cancel()
	var n int
	if err := conn.QueryRow(ctx, "select $1::int + 1", 41).Scan(&n); err != nil {
		return err.Error()
	}
	if n != 42 {
		return fmt.Sprintf("select 41 + 1 returned %d", n)
	}
	return ""
}

func TestS7ContextCancelRequest(t *testing.T) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse config: %v", err)
	}
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: cancelLimit}
	}
	ctx, cancel := opCtx()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	cancel()
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer func() {
		ctx, cancel := opCtx()
		defer cancel()
		conn.Close(ctx)
	}()
	for _, sql := range []string{"select pg_sleep(30)", "select pg_sleep($1)"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		var err error
		if sql == "select pg_sleep(30)" {
			_, err = conn.Exec(ctx, sql)
		} else {
			_, err = conn.Exec(ctx, sql, 30.0)
		}
		elapsed := time.Since(start)
		cancel()
		if sqlState(err) != "57014" {
			t.Errorf("%s with a 1 s context: want SQLSTATE 57014, got %v (after %v)", sql, err, elapsed.Round(time.Millisecond))
		} else if elapsed > cancelLimit {
			t.Errorf("%s: cancelled only after %v", sql, elapsed.Round(time.Millisecond))
		}
		if conn.IsClosed() {
			t.Fatalf("%s: the connection was closed by the cancel", sql)
		}
		if msg := checkConnWorks(conn); msg != "" {
			t.Errorf("%s: the connection does not work after the cancel: %s", sql, msg)
		}
		t.Logf("%s: cancelled after %v", sql, elapsed.Round(time.Millisecond))
	}
}

func TestS7ContextCancelDefault(t *testing.T) {
	const marker = "compat_go_ctx_default"
	conn, err := connect()
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	start := time.Now()
	_, err = conn.Exec(ctx, "select pg_sleep(30) /* "+marker+" */")
	elapsed := time.Since(start)
	cancel()
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)) {
		t.Errorf("pg_sleep(30) with a 1 s context: want a timeout error, got %v", err)
	}
	if elapsed > cancelLimit {
		t.Errorf("pg_sleep(30) with a 1 s context returned only after %v", elapsed.Round(time.Millisecond))
	}
	t.Logf("default context cancel returned after %v: %v (connection closed: %v)", elapsed.Round(time.Millisecond), err, conn.IsClosed())
	{
		ctx, cancel := opCtx()
		conn.Close(ctx)
		cancel()
	}

	// On closing, pgx sends a CancelRequest (and Terminate) in the
	// background: the abandoned pg_sleep must end on the server within a
	// few seconds. Checked out of band; if it is still running it is
	// cancelled there so that the rest of the suite is not slowed down.
	direct, err := directConnect()
	if err != nil {
		t.Fatalf("out-of-band connection: %v", err)
	}
	{
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		defer direct.Close(ctx)
		const running = "select count(*) from pg_stat_activity where query like $1 and state = 'active' and pid <> pg_backend_pid()"
		end := time.Now().Add(cancelLimit)
		var n int
		for {
			if err := direct.QueryRow(ctx, running, "%"+marker+"%").Scan(&n); err != nil {
				t.Fatalf("out-of-band check: %v", err)
			}
			if n == 0 || time.Now().After(end) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if n != 0 {
			t.Errorf("the abandoned pg_sleep(30) is still running on the server %v after the context expired", time.Since(start).Round(time.Millisecond))
			if _, err := direct.Exec(ctx, "select pg_cancel_backend(pid) from pg_stat_activity where query like $1 and pid <> pg_backend_pid()", "%"+marker+"%"); err != nil {
				t.Logf("out-of-band cancel: %v", err)
			}
		}
	}

	// Everyone else can still work: more concurrent queries than sluice
	// has server connections.
	pool := newPool(t, 8)
	var f failures
	runWorkers(t, 8, 30*time.Second, func(w int) {
		ctx, cancel := opCtx()
		defer cancel()
		var n int
		if err := pool.QueryRow(ctx, "select $1::int from pg_sleep(0.2)", w).Scan(&n); err != nil || n != w {
			f.add("query after an abandoned one: %d, %v", n, err)
		}
	})
	f.report(t, "after default context cancel")
}

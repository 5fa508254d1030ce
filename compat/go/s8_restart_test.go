package compat

// Scenario 8: PostgreSQL restarted (pg_ctl restart -m fast) under load.
//
// Workers run transactions in a loop while the suite runs
// COMPAT_RESTART_CMD. Errors during the restart are allowed (retry with
// backoff); within 20 s after the restart every worker must complete
// transactions again. Two kinds of workers:
//   - dedicated pgx.Conn with statements prepared explicitly before the
//     restart; a worker reconnects (and prepares again) only when pgx has
//     closed its connection, so a connection that survives the restart
//     keeps using the statements prepared before it;
//   - pgxpool with the default statement cache (the pool replaces broken
//     connections itself).
// Afterwards every committed insert is in the table.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type restartWorker struct {
	mu sync.Mutex
	restartStats
}

type restartStats struct {
	name           string
	ok             int           // committed transactions
	okAfter        int           // ... started after the restart finished
	okAfterOldConn int           // ... on a connection prepared before the restart
	errs           int           // failed attempts
	ambiguous      int           // failed COMMITs (may or may not have committed)
	reconnects     int           // new connections opened after the first
	lastErr        string        // most recent error
	lastErrAfter   string        // most recent error after the restart finished
	lastErrDelay   time.Duration // ... how long after the restart finished
}

func (w *restartWorker) snapshot() restartStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.restartStats
}

// restartClock tells workers when the restart started and finished.
type restartClock struct {
	mu             sync.Mutex
	started, ended time.Time
}

func (c *restartClock) get() (time.Time, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started, c.ended
}

const (
	restartSel = "compat_go_restart_sel"
	restartIns = "compat_go_restart_ins"
)

func TestS8ServerRestart(t *testing.T) {
	restartCmd := os.Getenv("COMPAT_RESTART_CMD")
	if restartCmd == "" {
		t.Fatal("COMPAT_RESTART_CMD is not set")
	}
	const dedicated, idle, pooled = 4, 2, 4
	var clock restartClock
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var workers []*restartWorker

	resume := make(chan struct{}) // closed when the idle workers resume
	for i := 0; i < dedicated+idle; i++ {
		name, wait := fmt.Sprintf("dedicated-%d", i), (<-chan struct{})(nil)
		if i >= dedicated {
			name, wait = fmt.Sprintf("idle-%d", i-dedicated), resume
		}
		w := &restartWorker{restartStats: restartStats{name: name}}
		workers = append(workers, w)
		wg.Add(1)
		go func(id int) { defer wg.Done(); runDedicatedRestartWorker(id, w, &clock, stop, wait) }(i)
	}
	pool := newPool(t, pooled)
	for i := 0; i < pooled; i++ {
		w := &restartWorker{restartStats: restartStats{name: fmt.Sprintf("pooled-%d", i)}}
		workers = append(workers, w)
		wg.Add(1)
		go func(id int) { defer wg.Done(); runPooledRestartWorker(dedicated+idle+id, w, pool, &clock, stop) }(i)
	}
	stopWorkers := func() {
		close(stop)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * opTimeout):
			t.Errorf("restart workers did not stop")
		}
	}
	describe := func() string {
		var b strings.Builder
		for _, w := range workers {
			s := w.snapshot()
			fmt.Fprintf(&b, "\n  %s: %d ok, %d after the restart", s.name, s.ok, s.okAfter)
			if !strings.HasPrefix(s.name, "pooled") {
				fmt.Fprintf(&b, " (%d of them on the connection that prepared its statements before the restart, %d reconnects)", s.okAfterOldConn, s.reconnects)
			}
			fmt.Fprintf(&b, ", %d errors, %d failed commits", s.errs, s.ambiguous)
			if s.lastErrAfter != "" {
				fmt.Fprintf(&b, "; last error %v after the restart: %s", s.lastErrDelay.Round(time.Millisecond), s.lastErrAfter)
			} else if s.lastErr != "" {
				fmt.Fprintf(&b, "; last error: %s", s.lastErr)
			}
		}
		return b.String()
	}
	waitFor := func(limit time.Duration, cond func(restartStats) bool) bool {
		end := time.Now().Add(limit)
		for time.Now().Before(end) {
			all := true
			for _, w := range workers {
				if !cond(w.snapshot()) {
					all = false
				}
			}
			if all {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return false
	}

	// Load before the restart. Workers that do not get going are reported,
	// and the restart goes ahead for the others.
	if !waitFor(10*time.Second, func(s restartStats) bool { return s.ok >= 10 }) {
		t.Errorf("not every worker committed 10 transactions in 10 s before the restart:%s", describe())
	}

	clock.mu.Lock()
	clock.started = time.Now()
	clock.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	out, err := exec.CommandContext(ctx, "sh", "-c", restartCmd).CombinedOutput()
	cancel()
	clock.mu.Lock()
	clock.ended = time.Now()
	clock.mu.Unlock()
	if err != nil {
		stopWorkers()
		t.Fatalf("restart command failed: %v\n%s", err, out)
	}
	started, ended := clock.get()
	t.Logf("PostgreSQL restarted in %v", ended.Sub(started).Round(time.Millisecond))

	// The idle workers resume once another worker has committed after the
	// restart (or after 15 s), on the connections they had before it.
	go func() {
		defer close(resume)
		end := time.Now().Add(15 * time.Second)
		for time.Now().Before(end) {
			for _, w := range workers {
				if s := w.snapshot(); !strings.HasPrefix(s.name, "idle") && s.okAfter > 0 {
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	// Within 20 s every worker commits again.
	recovered := waitFor(20*time.Second, func(s restartStats) bool { return s.okAfter >= 5 })
	stopWorkers()
	if !recovered {
		t.Errorf("not every worker completed transactions within 20 s after the restart:%s", describe())
	} else {
		t.Logf("after the restart:%s", describe())
	}

	// Every committed insert is there (a failed COMMIT may or may not have
	// committed).
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var conn *pgx.Conn
	for conn == nil && ctx.Err() == nil {
		if conn, err = connect(); err != nil {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if conn == nil {
		t.Fatalf("no connection after the restart: %v", err)
	}
	defer conn.Close(ctx)
	for i, w := range workers {
		s := w.snapshot()
		var n int
		if err := conn.QueryRow(ctx, "select count(*) from compat_go.restart_log where worker = $1", i).Scan(&n); err != nil {
			t.Fatalf("count rows: %v", err)
		}
		if n < s.ok || n > s.ok+s.ambiguous {
			t.Errorf("%s: %d rows in compat_go.restart_log, but %d commits succeeded and %d failed", s.name, n, s.ok, s.ambiguous)
		}
	}
}

// attempt records the outcome of one transaction attempt.
func (w *restartWorker) attempt(clock *restartClock, began time.Time, connBorn time.Time, err error, commitFailed bool) {
	_, ended := clock.get()
	after := !ended.IsZero() && began.After(ended)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		w.ok++
		if after {
			w.okAfter++
			started, _ := clock.get()
			if !connBorn.IsZero() && connBorn.Before(started) {
				w.okAfterOldConn++
			}
		}
		return
	}
	w.errs++
	w.lastErr = err.Error()
	if after {
		w.lastErrAfter = err.Error()
		w.lastErrDelay = began.Sub(ended)
	}
	if commitFailed {
		w.ambiguous++
	}
}

func (w *restartWorker) failed(clock *restartClock, what string, err error) {
	w.attempt(clock, time.Now(), time.Time{}, fmt.Errorf("%s: %w", what, err), false)
}

// backoff sleeps between failed attempts (50 ms doubling to 1 s); false if
// the worker must stop.
func backoff(stop <-chan struct{}, d *time.Duration) bool {
	if *d == 0 {
		*d = 50 * time.Millisecond
	} else if *d < time.Second {
		*d *= 2
	}
	select {
	case <-stop:
		return false
	case <-time.After(*d):
		return true
	}
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// runDedicatedRestartWorker loops on its own connection. With a non-nil
// resume, it stops after 10 commits (before the restart) and stays idle
// until resume is closed.
func runDedicatedRestartWorker(id int, w *restartWorker, clock *restartClock, stop <-chan struct{}, resume <-chan struct{}) {
	var conn *pgx.Conn
	var connBorn time.Time
	var delay time.Duration
	defer func() {
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			conn.Close(ctx)
			cancel()
		}
	}()
	for n := 0; !stopped(stop); n++ {
		if resume != nil && w.snapshot().ok >= 10 {
			select {
			case <-resume:
				resume = nil
			case <-stop:
				return
			}
		}
		if conn == nil || conn.IsClosed() {
			if conn != nil {
				w.mu.Lock()
				w.reconnects++
				w.mu.Unlock()
			}
			var err error
			conn, err = connect()
			if err == nil {
				ctx, cancel := opCtx()
				if _, err = conn.Prepare(ctx, restartSel, "select $1::int * 3"); err == nil {
					_, err = conn.Prepare(ctx, restartIns, "insert into compat_go.restart_log (worker, n) values ($1, $2)")
				}
				cancel()
				if err != nil {
					conn.Close(context.Background())
				}
			}
			if err != nil {
				conn = nil
				w.failed(clock, "connect and prepare", err)
				if !backoff(stop, &delay) {
					return
				}
				continue
			}
			connBorn = time.Now()
		}
		began := time.Now()
		commitFailed := false
		err := func() error {
			ctx, cancel := opCtx()
			defer cancel()
			tx, err := conn.Begin(ctx)
			if err != nil {
				return fmt.Errorf("begin: %w", err)
			}
			defer tx.Rollback(ctx)
			var got int
			if err := tx.QueryRow(ctx, restartSel, n).Scan(&got); err != nil {
				return fmt.Errorf("execute %s: %w", restartSel, err)
			}
			if got != 3*n {
				return fmt.Errorf("execute %s: got %d, want %d", restartSel, got, 3*n)
			}
			if _, err := tx.Exec(ctx, restartIns, id, n); err != nil {
				return fmt.Errorf("execute %s: %w", restartIns, err)
			}
			if err := tx.Commit(ctx); err != nil {
				commitFailed = true
				return fmt.Errorf("commit: %w", err)
			}
			return nil
		}()
		w.attempt(clock, began, connBorn, err, commitFailed)
		if err != nil {
			if !backoff(stop, &delay) {
				return
			}
		} else {
			delay = 0
			time.Sleep(5 * time.Millisecond) // steady load, not a busy loop
		}
	}
}

func runPooledRestartWorker(id int, w *restartWorker, pool *pgxpool.Pool, clock *restartClock, stop <-chan struct{}) {
	var delay time.Duration
	for n := 0; !stopped(stop); n++ {
		began := time.Now()
		commitFailed := false
		err := func() error {
			ctx, cancel := opCtx()
			defer cancel()
			tx, err := pool.Begin(ctx)
			if err != nil {
				return fmt.Errorf("begin: %w", err)
			}
			defer tx.Rollback(ctx)
			var got int
			if err := tx.QueryRow(ctx, "select $1::int * 5", n).Scan(&got); err != nil {
				return fmt.Errorf("select: %w", err)
			}
			if got != 5*n {
				return fmt.Errorf("select: got %d, want %d", got, 5*n)
			}
			if _, err := tx.Exec(ctx, "insert into compat_go.restart_log (worker, n) values ($1, $2)", id, n); err != nil {
				return fmt.Errorf("insert: %w", err)
			}
			if err := tx.Commit(ctx); err != nil {
				commitFailed = true
				return fmt.Errorf("commit: %w", err)
			}
			return nil
		}()
		w.attempt(clock, began, time.Time{}, err, commitFailed)
		if err != nil {
			if !backoff(stop, &delay) {
				return
			}
		} else {
			delay = 0
			time.Sleep(5 * time.Millisecond) // steady load, not a busy loop
		}
	}
}

package compat

// Scenario 2: named prepared statements reused across transactions.
//
//   - explicit Conn.Prepare: every worker prepares the same names with the
//     same SQL (plus one name of its own for the same text, and a second
//     text), then executes them by name in many separate transactions;
//   - the default statement cache (QueryExecModeCacheStatement): pgx
//     prepares "stmtcache_<sha256>" once per connection and reuses it; the
//     name is the same on every connection for the same SQL text.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	sqlAdd  = "select $1::int + $2::int"
	sqlIns  = "insert into compat_go.prep (worker, n) values ($1, $2) returning n * 2"
	sqlUpp  = "select upper($1::text)"
	sqlMul  = "select $1::int * 2"
	sqlConc = "select $1::text || '-' || $2::int"
)

func TestS2PreparedExplicit(t *testing.T) {
	const workers, iters = 16, 60
	var f failures
	committed := make([]int, workers)

	runWorkers(t, workers, 90*time.Second, func(w int) {
		conn, err := connect()
		if err != nil {
			f.add("connect: %v", err)
			return
		}
		defer func() {
			ctx, cancel := opCtx()
			defer cancel()
			conn.Close(ctx)
		}()
		own := fmt.Sprintf("compat_go_add_w%d", w)
		{
			ctx, cancel := opCtx()
			for name, sql := range map[string]string{"compat_go_add": sqlAdd, own: sqlAdd, "compat_go_ins": sqlIns} {
				if _, err := conn.Prepare(ctx, name, sql); err != nil {
					f.add("prepare %s: %v", strings.TrimSuffix(name, fmt.Sprint(w)), err)
					cancel()
					return
				}
			}
			cancel()
		}
		for i := 0; i < iters; i++ {
			step, err := func() (string, error) {
				ctx, cancel := opCtx()
				defer cancel()
				checkAdd := func(q pgx.Row, name string, a, b int) (string, error) {
					var got int
					if err := q.Scan(&got); err != nil {
						return "execute " + name, err
					}
					if got != a+b {
						return "execute " + name, fmt.Errorf("got %d, want %d", got, a+b)
					}
					return "", nil
				}
				if i%10 == 9 {
					// Outside any transaction (autocommit).
					if s, err := checkAdd(conn.QueryRow(ctx, "compat_go_add", i, w), "compat_go_add (autocommit)", i, w); err != nil {
						return s, err
					}
					return checkAdd(conn.QueryRow(ctx, own, w, 7), "compat_go_add_wN (autocommit)", w, 7)
				}
				tx, err := conn.Begin(ctx)
				if err != nil {
					return "begin", err
				}
				defer tx.Rollback(ctx)
				if s, err := checkAdd(tx.QueryRow(ctx, "compat_go_add", i, w), "compat_go_add", i, w); err != nil {
					return s, err
				}
				if s, err := checkAdd(tx.QueryRow(ctx, own, i, 1000), "compat_go_add_wN", i, 1000); err != nil {
					return s, err
				}
				var dbl int
				if err := tx.QueryRow(ctx, "compat_go_ins", w, i).Scan(&dbl); err != nil {
					return "execute compat_go_ins", err
				}
				if dbl != 2*i {
					return "execute compat_go_ins", fmt.Errorf("returned %d, want %d", dbl, 2*i)
				}
				if i == 0 {
					// Prepared inside a transaction that commits: usable afterwards.
					if _, err := tx.Prepare(ctx, "compat_go_upper", sqlUpp); err != nil {
						return "prepare compat_go_upper in transaction", err
					}
				}
				var up string
				if err := tx.QueryRow(ctx, "compat_go_upper", fmt.Sprintf("w%d-i%d", w, i)).Scan(&up); err != nil {
					return "execute compat_go_upper", err
				}
				if want := fmt.Sprintf("W%d-I%d", w, i); up != want {
					return "execute compat_go_upper", fmt.Errorf("got %q, want %q", up, want)
				}
				if err := tx.Commit(ctx); err != nil {
					return "commit", err
				}
				committed[w]++
				return "", nil
			}()
			if err != nil {
				f.add("%s: %v", step, err)
				return
			}
		}
	})
	f.report(t, "explicit prepared statements")

	ctx, cancel := opCtx()
	defer cancel()
	conn, err := connect()
	if err != nil {
		t.Fatalf("connect for final check: %v", err)
	}
	defer conn.Close(ctx)
	for w := 0; w < workers; w++ {
		var c int
		if err := conn.QueryRow(ctx, "select count(*) from compat_go.prep where worker = $1", w).Scan(&c); err != nil {
			t.Fatalf("final count: %v", err)
		}
		if c != committed[w] {
			t.Errorf("worker %d: %d rows in compat_go.prep, %d transactions committed", w, c, committed[w])
		}
		if f.count() == 0 && committed[w] != iters-iters/10 {
			t.Errorf("worker %d committed %d transactions, want %d", w, committed[w], iters-iters/10)
		}
	}
}

// prepareCounter is a pgx tracer counting the statements the driver really
// prepares (Parse sent to the server) and the queries it runs.
type prepareCounter struct {
	mu       sync.Mutex
	prepares map[string]int // statement name -> Parse count
	queries  map[string]int // SQL -> executions
}

type prepNameKey struct{}

func (p *prepareCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	p.mu.Lock()
	p.queries[d.SQL]++
	p.mu.Unlock()
	return ctx
}

func (p *prepareCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (p *prepareCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	return context.WithValue(ctx, prepNameKey{}, d.Name)
}

func (p *prepareCounter) TracePrepareEnd(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	if d.AlreadyPrepared || d.Err != nil {
		return
	}
	name, _ := ctx.Value(prepNameKey{}).(string)
	p.mu.Lock()
	p.prepares[name]++
	p.mu.Unlock()
}

// stmtcacheName is the name pgx's statement cache gives a SQL text.
func stmtcacheName(sql string) string {
	d := sha256.Sum256([]byte(sql))
	return "stmtcache_" + hex.EncodeToString(d[0:24])
}

func TestS2StatementCache(t *testing.T) {
	const workers, iters = 16, 80
	counter := &prepareCounter{prepares: map[string]int{}, queries: map[string]int{}}
	p := newPoolWith(t, workers, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = counter })
	var f failures

	runWorkers(t, workers, 90*time.Second, func(w int) {
		for i := 0; i < iters; i++ {
			step, err := func() (string, error) {
				ctx, cancel := opCtx()
				defer cancel()
				tx, err := p.Begin(ctx)
				if err != nil {
					return "begin", err
				}
				defer tx.Rollback(ctx)
				var m int
				if err := tx.QueryRow(ctx, sqlMul, w*1000+i).Scan(&m); err != nil {
					return sqlMul, err
				}
				if m != 2*(w*1000+i) {
					return sqlMul, fmt.Errorf("got %d, want %d", m, 2*(w*1000+i))
				}
				var s string
				if err := tx.QueryRow(ctx, sqlConc, fmt.Sprintf("w%d", w), i).Scan(&s); err != nil {
					return sqlConc, err
				}
				if want := fmt.Sprintf("w%d-%d", w, i); s != want {
					return sqlConc, fmt.Errorf("got %q, want %q", s, want)
				}
				if err := tx.Commit(ctx); err != nil {
					return "commit", err
				}
				return "", nil
			}()
			if err != nil {
				f.add("%s: %v", step, err)
				return
			}
		}
	})
	f.report(t, "statement cache")
	if f.count() > 0 {
		return
	}

	// The default mode really used named statements, prepared once per
	// connection and reused by every later transaction on it.
	conns := int(p.Stat().TotalConns())
	counter.mu.Lock()
	defer counter.mu.Unlock()
	for _, sql := range []string{sqlMul, sqlConc} {
		name := stmtcacheName(sql)
		n := counter.prepares[name]
		t.Logf("%q: prepared %d times as %s, executed %d times, over %d connections",
			sql, n, name, counter.queries[sql], conns)
		if n < 1 || n > conns {
			t.Errorf("%q: prepared %d times as %s over %d connections (want 1..%d); all prepares: %v",
				sql, n, name, conns, conns, counter.prepares)
		}
		if counter.queries[sql] != workers*iters {
			t.Errorf("%q executed %d times, want %d", sql, counter.queries[sql], workers*iters)
		}
	}
}

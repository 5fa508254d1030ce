package compat

// Scenario 1: many concurrent workers (more than sluice's pool) running
// parameterized queries and transactions through pgxpool.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestS1ConcurrentWorkers(t *testing.T) {
	const workers, iters = 24, 150
	pool := newPool(t, workers)
	var f failures
	inserted := make([]int, workers)
	start := time.Now()

	runWorkers(t, workers, 90*time.Second, func(w int) {
		for i := 0; i < iters; i++ {
			kind, err := func() (string, error) {
				ctx, cancel := opCtx()
				defer cancel()
				switch i % 3 {
				case 0:
					var got int
					if err := pool.QueryRow(ctx, "select $1::int + 1", w*100000+i).Scan(&got); err != nil {
						return "select $1::int + 1", err
					}
					if got != w*100000+i+1 {
						return "select $1::int + 1", fmt.Errorf("got %d, want %d", got, w*100000+i+1)
					}
				case 1:
					var got string
					want := fmt.Sprintf("w%d/%d", w, i)
					if err := pool.QueryRow(ctx, "select $1::text || '/' || $2::int", fmt.Sprintf("w%d", w), i).Scan(&got); err != nil {
						return "select text concat", err
					}
					if got != want {
						return "select text concat", fmt.Errorf("got %q, want %q", got, want)
					}
				case 2:
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, "insert into compat_go.load (worker, n) values ($1, $2)", w, i); err != nil {
							return err
						}
						var c int
						if err := tx.QueryRow(ctx, "select count(*) from compat_go.load where worker = $1", w).Scan(&c); err != nil {
							return err
						}
						if c != inserted[w]+1 {
							return fmt.Errorf("count inside transaction: got %d, want %d", c, inserted[w]+1)
						}
						return nil
					})
					if err != nil {
						return "insert transaction", err
					}
					inserted[w]++
				}
				return "", nil
			}()
			if err != nil {
				f.add("%s: %v", kind, err)
				return // a worker stops at its first failure
			}
		}
	})
	t.Logf("%d workers x %d operations in %v; pool stats: total conns %d, max %d",
		workers, iters, time.Since(start).Round(time.Millisecond), pool.Stat().TotalConns(), pool.Stat().MaxConns())
	f.report(t, "concurrent workers")

	// Every committed insert is there, once.
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	rows, err := pool.Query(ctx, "select worker, count(*) from compat_go.load group by worker")
	if err != nil {
		t.Fatalf("final count: %v", err)
	}
	counts := map[int]int{}
	for rows.Next() {
		var w, c int
		if err := rows.Scan(&w, &c); err != nil {
			t.Fatalf("final count scan: %v", err)
		}
		counts[w] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("final count: %v", err)
	}
	for w := 0; w < workers; w++ {
		if counts[w] != inserted[w] {
			t.Errorf("worker %d: %d rows in compat_go.load, %d inserts committed", w, counts[w], inserted[w])
		}
	}
	if f.count() == 0 {
		for w := 0; w < workers; w++ {
			if inserted[w] != iters/3 {
				t.Errorf("worker %d committed %d inserts, want %d", w, inserted[w], iters/3)
			}
		}
	}
}

package compat

// Scenario 3: transactions that fail (unique violation, explicit error) are
// rolled back and retried on the same connection; the rolled-back writes are
// absent. Plus pgx.Batch: a batch whose third query fails.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestS3RollbackRetry(t *testing.T) {
	const workers, iters = 8, 25
	pool := newPool(t, workers)
	var f failures

	runWorkers(t, workers, 90*time.Second, func(w int) {
		ctx, cancel := opCtx()
		c, err := pool.Acquire(ctx)
		cancel()
		if err != nil {
			f.add("acquire: %v", err)
			return
		}
		defer c.Release()
		conn := c.Conn()
		for i := 0; i < iters; i++ {
			key := 1 + w*1000 + i
			step, err := func() (string, error) {
				ctx, cancel := opCtx()
				defer cancel()

				// Attempt 1: unique violation on the seeded key 0.
				tx, err := conn.Begin(ctx)
				if err != nil {
					return "begin 1", err
				}
				if _, err := tx.Exec(ctx, "insert into compat_go.uniq (k, worker, note) values ($1, $2, $3)", key, w, "attempt-1"); err != nil {
					tx.Rollback(ctx)
					return "insert attempt 1", err
				}
				_, err = tx.Exec(ctx, "insert into compat_go.uniq (k, worker, note) values ($1, $2, $3)", 0, w, "conflict")
				if sqlState(err) != "23505" {
					tx.Rollback(ctx)
					return "conflicting insert", fmt.Errorf("want SQLSTATE 23505, got %v", err)
				}
				// The transaction is aborted until rolled back.
				var one int
				err = tx.QueryRow(ctx, "select $1::int", 1).Scan(&one)
				if sqlState(err) != "25P02" {
					tx.Rollback(ctx)
					return "query in aborted transaction", fmt.Errorf("want SQLSTATE 25P02, got %v", err)
				}
				if err := tx.Rollback(ctx); err != nil {
					return "rollback 1", err
				}
				if n, err := countKey(ctx, conn, key); err != nil || n != 0 {
					return "after rollback 1", fmt.Errorf("rolled-back row count %d (want 0), err %v", n, err)
				}

				// Attempt 2: explicit error (division by zero) after the insert.
				tx, err = conn.Begin(ctx)
				if err != nil {
					return "begin 2", err
				}
				if _, err := tx.Exec(ctx, "insert into compat_go.uniq (k, worker, note) values ($1, $2, $3)", key, w, "attempt-2"); err != nil {
					tx.Rollback(ctx)
					return "insert attempt 2", err
				}
				err = tx.QueryRow(ctx, "select 1 / $1::int", 0).Scan(&one)
				if sqlState(err) != "22012" {
					tx.Rollback(ctx)
					return "division by zero", fmt.Errorf("want SQLSTATE 22012, got %v", err)
				}
				if err := tx.Rollback(ctx); err != nil {
					return "rollback 2", err
				}
				if n, err := countKey(ctx, conn, key); err != nil || n != 0 {
					return "after rollback 2", fmt.Errorf("rolled-back row count %d (want 0), err %v", n, err)
				}

				// Retry: succeeds, through pgx.BeginFunc this time.
				err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "insert into compat_go.uniq (k, worker, note) values ($1, $2, $3)", key, w, "final")
					return err
				})
				if err != nil {
					return "retry", err
				}
				if n, err := countKey(ctx, conn, key); err != nil || n != 1 {
					return "after retry", fmt.Errorf("committed row count %d (want 1), err %v", n, err)
				}
				return "", nil
			}()
			if err != nil {
				f.add("%s: %v", step, err)
				return
			}
		}
	})
	f.report(t, "rollback and retry")

	ctx, cancel := opCtx()
	defer cancel()
	var total, final int
	err := pool.QueryRow(ctx, "select count(*), count(*) filter (where note = 'final') from compat_go.uniq where k > $1", 0).Scan(&total, &final)
	if err != nil {
		t.Fatalf("final count: %v", err)
	}
	if total != final {
		t.Errorf("%d rows from rolled-back attempts are present", total-final)
	}
	if f.count() == 0 && final != workers*iters {
		t.Errorf("%d committed rows, want %d", final, workers*iters)
	}
}

func countKey(ctx context.Context, conn *pgx.Conn, key int) (int, error) {
	var n int
	err := conn.QueryRow(ctx, "select count(*) from compat_go.uniq where k = $1", key).Scan(&n)
	return n, err
}

func TestS3Batch(t *testing.T) {
	const workers, iters = 8, 20
	pool := newPool(t, workers)
	var f failures

	runWorkers(t, workers, 90*time.Second, func(w int) {
		for i := 0; i < iters; i++ {
			step, err := batchRound(pool, w, i)
			if err != nil {
				f.add("%s: %v", step, err)
				return
			}
		}
	})
	f.report(t, "batch")

	ctx, cancel := opCtx()
	defer cancel()
	var good, bad int
	err := pool.QueryRow(ctx, "select count(*) filter (where n >= $1), count(*) filter (where n < $1) from compat_go.batch", 0).Scan(&good, &bad)
	if err != nil {
		t.Fatalf("final count: %v", err)
	}
	if bad != 0 {
		t.Errorf("%d rows inserted by failed batches are present", bad)
	}
	if f.count() == 0 && good != workers*iters {
		t.Errorf("%d rows inserted by successful batches, want %d", good, workers*iters)
	}
}

// batchRound sends one successful batch and one whose third query fails, on
// the same pooled connection, and checks the connection afterwards.
func batchRound(pool *pgxpool.Pool, w, i int) (string, error) {
	ctx, cancel := opCtx()
	defer cancel()
	c, err := pool.Acquire(ctx)
	if err != nil {
		return "acquire", err
	}
	defer c.Release()
	conn := c.Conn()

	// A batch that succeeds: every result checked.
	b := &pgx.Batch{}
	b.Queue("select $1::int + 1", i)
	b.Queue("insert into compat_go.batch (worker, n) values ($1, $2)", w, i)
	b.Queue("select count(*) from compat_go.batch where worker = $1", w)
	b.Queue("select $1::text || $2::text", "w", fmt.Sprint(w))
	br := conn.SendBatch(ctx, b)
	var n int
	if err := br.QueryRow().Scan(&n); err != nil || n != i+1 {
		br.Close()
		return "ok batch query 1", fmt.Errorf("got %d (want %d), err %v", n, i+1, err)
	}
	tag, err := br.Exec()
	if err != nil || tag.RowsAffected() != 1 {
		br.Close()
		return "ok batch insert", fmt.Errorf("tag %q, err %v", tag, err)
	}
	if err := br.QueryRow().Scan(&n); err != nil || n != i+1 {
		br.Close()
		return "ok batch count", fmt.Errorf("got %d (want %d), err %v", n, i+1, err)
	}
	var s string
	if err := br.QueryRow().Scan(&s); err != nil || s != fmt.Sprintf("w%d", w) {
		br.Close()
		return "ok batch query 4", fmt.Errorf("got %q, err %v", s, err)
	}
	if err := br.Close(); err != nil {
		return "ok batch close", err
	}

	// A batch failing in the middle: results before the error are
	// delivered, the error is 22012, the rest fails, and since the batch
	// is one implicit transaction its insert is rolled back.
	b = &pgx.Batch{}
	b.Queue("select $1::int + 10", i)
	b.Queue("insert into compat_go.batch (worker, n) values ($1, $2)", w, -1-i)
	b.Queue("select 10 / $1::int", 0)
	b.Queue("select $1::int + 20", i)
	br = conn.SendBatch(ctx, b)
	if err := br.QueryRow().Scan(&n); err != nil || n != i+10 {
		br.Close()
		return "failing batch query 1", fmt.Errorf("got %d (want %d), err %v", n, i+10, err)
	}
	if tag, err := br.Exec(); err != nil || tag.RowsAffected() != 1 {
		br.Close()
		return "failing batch insert", fmt.Errorf("tag %q, err %v", tag, err)
	}
	err = br.QueryRow().Scan(&n)
	if sqlState(err) != "22012" {
		br.Close()
		return "failing batch query 3", fmt.Errorf("want SQLSTATE 22012, got %v", err)
	}
	if err := br.QueryRow().Scan(&n); err == nil {
		br.Close()
		return "failing batch query 4", errors.New("succeeded after the error in the batch")
	}
	if err := br.Close(); sqlState(err) != "22012" {
		return "failing batch close", fmt.Errorf("want SQLSTATE 22012, got %v", err)
	}

	// The connection works and the failed batch left nothing behind.
	var bad int
	if err := conn.QueryRow(ctx, "select count(*) from compat_go.batch where worker = $1 and n < 0", w).Scan(&bad); err != nil {
		return "after failing batch", err
	}
	if bad != 0 {
		return "after failing batch", fmt.Errorf("%d rows of the failed batch are present", bad)
	}
	return "", nil
}

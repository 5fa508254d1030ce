package compat

// Scenario 6: COPY. Concurrent Conn.CopyFrom (binary COPY FROM STDIN) of
// 10,000 rows, a text COPY FROM STDIN through PgConn.CopyFrom, COPY TO STDOUT
// through PgConn.CopyTo with the content checked line by line, a COPY in a
// rolled-back transaction and a COPY failing on a duplicate key.

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func copyRow(id int) []any {
	return []any{id, fmt.Sprintf("name-%d\t\"q\" é", id), int64(id) * 3, []string{"t", fmt.Sprint(id % 7)}}
}

func TestS6Copy(t *testing.T) {
	const workers, perWorker = 4, 2500
	pool := newPool(t, workers)
	var f failures

	runWorkers(t, workers, 60*time.Second, func(w int) {
		ctx, cancel := opCtx()
		defer cancel()
		rows := make([][]any, perWorker)
		for i := range rows {
			rows[i] = copyRow(w*perWorker + i + 1)
		}
		n, err := pool.CopyFrom(ctx, pgx.Identifier{"compat_go", "copy_bin"}, []string{"id", "name", "amount", "tags"}, pgx.CopyFromRows(rows))
		if err != nil {
			f.add("CopyFrom: %v", err)
			return
		}
		if n != perWorker {
			f.add("CopyFrom copied %d rows, want %d", n, perWorker)
		}
	})
	f.report(t, "concurrent CopyFrom")
	if t.Failed() {
		return
	}

	ctx, cancel := opCtx()
	defer cancel()
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer c.Release()
	conn := c.Conn()
	const total = workers * perWorker

	var count, sumAmount, distinctNames int64
	err = conn.QueryRow(ctx, "select count(*), sum(amount), count(distinct name) from compat_go.copy_bin where $1::int = 1", 1).Scan(&count, &sumAmount, &distinctNames)
	if err != nil {
		t.Fatalf("check copied rows: %v", err)
	}
	if count != total || sumAmount != 3*int64(total)*(total+1)/2 || distinctNames != total {
		t.Errorf("after CopyFrom: count %d, sum(amount) %d, distinct names %d; want %d, %d, %d",
			count, sumAmount, distinctNames, total, 3*int64(total)*(total+1)/2, total)
	}

	// COPY TO STDOUT (text format): every line as PostgreSQL renders it.
	var buf bytes.Buffer
	tag, err := conn.PgConn().CopyTo(ctx, &buf, "copy (select id, name, amount, tags from compat_go.copy_bin order by id) to stdout")
	if err != nil {
		t.Fatalf("CopyTo: %v", err)
	}
	if tag.RowsAffected() != total {
		t.Errorf("CopyTo reported %d rows, want %d", tag.RowsAffected(), total)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != total {
		t.Fatalf("CopyTo produced %d lines, want %d", len(lines), total)
	}
	for i, line := range lines {
		id := i + 1
		want := fmt.Sprintf("%d\tname-%d\\t\"q\" é\t%d\t{t,%d}", id, id, 3*id, id%7)
		if line != want {
			t.Fatalf("CopyTo line %d: got %q, want %q", id, line, want)
		}
	}

	// Text COPY FROM STDIN through the low-level API, then back out as CSV.
	const textRows = 3000
	var in strings.Builder
	for i := 1; i <= textRows; i++ {
		fmt.Fprintf(&in, "%d\tline %d, with \\\\ and ü\n", i, i)
	}
	tag, err = conn.PgConn().CopyFrom(ctx, strings.NewReader(in.String()), "copy compat_go.copy_text (id, line) from stdin")
	if err != nil {
		t.Fatalf("text CopyFrom: %v", err)
	}
	if tag.RowsAffected() != textRows {
		t.Errorf("text CopyFrom reported %d rows, want %d", tag.RowsAffected(), textRows)
	}
	buf.Reset()
	if _, err := conn.PgConn().CopyTo(ctx, &buf, "copy (select id, line from compat_go.copy_text order by id) to stdout with (format csv)"); err != nil {
		t.Fatalf("CopyTo csv: %v", err)
	}
	var wantCSV strings.Builder
	for i := 1; i <= textRows; i++ {
		fmt.Fprintf(&wantCSV, "%d,\"line %d, with \\ and ü\"\n", i, i)
	}
	if buf.String() != wantCSV.String() {
		t.Errorf("CSV COPY TO differs from what was copied in (got %d bytes, want %d); first line %q",
			buf.Len(), wantCSV.Len(), strings.SplitN(buf.String(), "\n", 2)[0])
	}

	// COPY inside a transaction that is rolled back leaves nothing.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	rows := [][]any{copyRow(900001), copyRow(900002), copyRow(900003)}
	if n, err := tx.CopyFrom(ctx, pgx.Identifier{"compat_go", "copy_bin"}, []string{"id", "name", "amount", "tags"}, pgx.CopyFromRows(rows)); err != nil || n != 3 {
		t.Errorf("CopyFrom in transaction: %d rows, %v", n, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}

	// COPY failing on a duplicate key: SQLSTATE 23505, nothing copied, and
	// the connection works afterwards.
	rows = [][]any{copyRow(800001), copyRow(1)}
	_, err = conn.CopyFrom(ctx, pgx.Identifier{"compat_go", "copy_bin"}, []string{"id", "name", "amount", "tags"}, pgx.CopyFromRows(rows))
	if sqlState(err) != "23505" {
		t.Errorf("CopyFrom with a duplicate key: want SQLSTATE 23505, got %v", err)
	}
	err = conn.QueryRow(ctx, "select count(*) from compat_go.copy_bin where id > $1", total).Scan(&count)
	if err != nil {
		t.Fatalf("after failed COPY: %v", err)
	}
	if count != 0 {
		t.Errorf("%d rows from the rolled-back and failed COPYs are present", count)
	}
}

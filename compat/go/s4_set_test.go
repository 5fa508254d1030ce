package compat

// Scenario 4: session SET (search_path, application_name,
// statement_timeout) outside a transaction sticks to the client connection
// over many later transactions while concurrent workers have their own;
// SET LOCAL ends with its transaction; SET in a rolled-back transaction is
// undone.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

type sessionSettings struct {
	searchPath, appName, timeout string
}

func TestS4SessionSet(t *testing.T) {
	const iters = 60
	var f failures

	runWorkers(t, spWorkers, 90*time.Second, func(w int) {
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
		own := sessionSettings{
			searchPath: spSchema(w),
			appName:    fmt.Sprintf("compat_go_w%d", w),
			timeout:    fmt.Sprintf("%ds", 20+w),
		}
		other := spSchema((w + 1) % spWorkers)
		{
			ctx, cancel := opCtx()
			_, err := conn.Exec(ctx, fmt.Sprintf("set search_path to %s", own.searchPath))
			if err == nil {
				_, err = conn.Exec(ctx, fmt.Sprintf("set application_name = '%s'", own.appName))
			}
			if err == nil {
				_, err = conn.Exec(ctx, fmt.Sprintf("set statement_timeout = '%s'", own.timeout))
			}
			cancel()
			if err != nil {
				f.add("set: %v", err)
				return
			}
		}
		for i := 0; i < iters; i++ {
			step, err := func() (string, error) {
				ctx, cancel := opCtx()
				defer cancel()
				switch {
				case i%10 == 4:
					// SET LOCAL lasts until the end of its transaction.
					tx, err := conn.Begin(ctx)
					if err != nil {
						return "begin", err
					}
					defer tx.Rollback(ctx)
					for _, s := range []string{
						"set local search_path to " + other,
						"set local application_name = 'compat_go_local'",
						"set local statement_timeout = '3s'",
					} {
						if _, err := tx.Exec(ctx, s); err != nil {
							return s, err
						}
					}
					if s, err := checkSettings(ctx, tx, sessionSettings{other, "compat_go_local", "3s"}, "inside SET LOCAL transaction"); err != nil {
						return s, err
					}
					if err := tx.Commit(ctx); err != nil {
						return "commit", err
					}
					return checkSettings(ctx, conn, own, "after SET LOCAL transaction")
				case i%10 == 7:
					// SET in a rolled-back transaction is undone.
					tx, err := conn.Begin(ctx)
					if err != nil {
						return "begin", err
					}
					for _, s := range []string{
						"set search_path to " + other,
						"set application_name = 'compat_go_rolled_back'",
						"set statement_timeout = '4s'",
					} {
						if _, err := tx.Exec(ctx, s); err != nil {
							tx.Rollback(ctx)
							return s, err
						}
					}
					if s, err := checkSettings(ctx, tx, sessionSettings{other, "compat_go_rolled_back", "4s"}, "inside rolled-back transaction"); err != nil {
						tx.Rollback(ctx)
						return s, err
					}
					if err := tx.Rollback(ctx); err != nil {
						return "rollback", err
					}
					return checkSettings(ctx, conn, own, "after rolled-back SET")
				case i%2 == 0:
					// In a transaction.
					var s string
					var err error
					err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
						s, err = checkSettings(ctx, tx, own, "in transaction")
						return err
					})
					return s, err
				default:
					// Outside a transaction.
					return checkSettings(ctx, conn, own, "autocommit")
				}
			}()
			if err != nil {
				f.add("worker %d, %s: %v", w, step, err)
				return
			}
		}
	})
	f.report(t, "session SET")
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// checkSettings reads the settings with SHOW and current_setting, and
// resolves an unqualified table name, all through parameterized or cached
// statements.
func checkSettings(ctx context.Context, q querier, want sessionSettings, where string) (string, error) {
	var sp string
	if err := q.QueryRow(ctx, "show search_path").Scan(&sp); err != nil {
		return where + ": show search_path", err
	}
	if sp != want.searchPath {
		return where + ": show search_path", fmt.Errorf("got %q, want %q", sp, want.searchPath)
	}
	var who string
	if err := q.QueryRow(ctx, "select name from whoami where $1::int >= 0", 1).Scan(&who); err != nil {
		return where + ": unqualified whoami", err
	}
	if who != want.searchPath {
		return where + ": unqualified whoami", fmt.Errorf("resolved to %q's table, want %q", who, want.searchPath)
	}
	var app, timeout string
	if err := q.QueryRow(ctx, "select current_setting($1), current_setting($2)", "application_name", "statement_timeout").Scan(&app, &timeout); err != nil {
		return where + ": current_setting", err
	}
	if app != want.appName || timeout != want.timeout {
		return where + ": current_setting", fmt.Errorf("application_name %q, statement_timeout %q; want %q, %q", app, timeout, want.appName, want.timeout)
	}
	return "", nil
}

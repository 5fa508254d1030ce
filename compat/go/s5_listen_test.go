package compat

// Scenario 5: LISTEN/NOTIFY. Two listeners LISTEN on a channel; senders on
// other connections notify from committed transactions (NOTIFY and
// pg_notify with parameters), from rolled-back transactions, and on another
// channel. Each listener keeps running its own transactions while it waits
// with conn.WaitForNotification, and must get every committed payload exactly
// once and nothing else. After UNLISTEN on one listener, later notifications
// reach only the other.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	listenChan = "compat_go_chan"
	otherChan  = "compat_go_other"
)

// listener owns one connection and collects what it receives.
type listener struct {
	name string
	conn *pgx.Conn

	mu       sync.Mutex
	got      map[string]int // payload -> times received on listenChan
	wrong    []string       // notifications on another channel
	err      error
	txns     int
	stopFlag bool
}

func (l *listener) count(payload string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.got[payload]
}

func (l *listener) stop() {
	l.mu.Lock()
	l.stopFlag = true
	l.mu.Unlock()
}

// run alternates a small transaction and a short wait for notifications
// until stopped, or until deadline.
func (l *listener) run(deadline time.Time) {
	for i := 0; time.Now().Before(deadline); i++ {
		l.mu.Lock()
		stop := l.stopFlag
		l.mu.Unlock()
		if stop {
			return
		}
		if err := l.transaction(i); err != nil {
			l.mu.Lock()
			l.err = fmt.Errorf("%s: transaction while listening: %w", l.name, err)
			l.mu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		for {
			n, err := l.conn.WaitForNotification(ctx)
			if n != nil {
				l.mu.Lock()
				if n.Channel == listenChan {
					l.got[n.Payload]++
				} else {
					l.wrong = append(l.wrong, n.Channel+":"+n.Payload)
				}
				l.mu.Unlock()
			}
			if err != nil {
				// A timeout of the short wait is normal; anything else is not.
				if ctx.Err() == nil || !errors.Is(err, context.DeadlineExceeded) || l.conn.IsClosed() {
					l.mu.Lock()
					l.err = fmt.Errorf("%s: WaitForNotification: %w", l.name, err)
					l.mu.Unlock()
					cancel()
					return
				}
				break
			}
		}
		cancel()
	}
}

func (l *listener) transaction(i int) error {
	ctx, cancel := opCtx()
	defer cancel()
	return pgx.BeginFunc(ctx, l.conn, func(tx pgx.Tx) error {
		var got int
		if err := tx.QueryRow(ctx, "select $1::int * 3", i).Scan(&got); err != nil {
			return err
		}
		if got != 3*i {
			return fmt.Errorf("got %d, want %d", got, 3*i)
		}
		l.mu.Lock()
		l.txns++
		l.mu.Unlock()
		return nil
	})
}

func TestS5ListenNotify(t *testing.T) {
	const senders, perSender = 4, 20
	var listeners []*listener
	for _, name := range []string{"listener A", "listener B"} {
		conn, err := connect()
		if err != nil {
			t.Fatalf("%s: connect: %v", name, err)
		}
		defer func() {
			ctx, cancel := opCtx()
			defer cancel()
			conn.Close(ctx)
		}()
		ctx, cancel := opCtx()
		_, err = conn.Exec(ctx, "listen "+listenChan)
		cancel()
		if err != nil {
			t.Fatalf("%s: LISTEN: %v", name, err)
		}
		listeners = append(listeners, &listener{name: name, conn: conn, got: map[string]int{}})
	}
	deadline := time.Now().Add(45 * time.Second)
	var lwg sync.WaitGroup
	for _, l := range listeners {
		lwg.Add(1)
		go func(l *listener) { defer lwg.Done(); l.run(deadline) }(l)
	}
	stopListeners := func() {
		for _, l := range listeners {
			l.stop()
		}
		lwg.Wait()
	}

	pool := newPool(t, senders)
	var f failures
	var expected []string
	for s := 0; s < senders; s++ {
		for i := 0; i < perSender; i++ {
			expected = append(expected, fmt.Sprintf("s%d-n%d", s, i))
		}
	}
	runWorkers(t, senders, 60*time.Second, func(s int) {
		for i := 0; i < perSender; i++ {
			payload := fmt.Sprintf("s%d-n%d", s, i)
			step, err := func() (string, error) {
				ctx, cancel := opCtx()
				defer cancel()
				// Committed: NOTIFY (simple protocol) or pg_notify with parameters.
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if i%2 == 0 {
						_, err := tx.Exec(ctx, fmt.Sprintf("notify %s, '%s'", listenChan, payload))
						return err
					}
					_, err := tx.Exec(ctx, "select pg_notify($1, $2)", listenChan, payload)
					return err
				})
				if err != nil {
					return "committed notify", err
				}
				// Rolled back: never delivered.
				tx, err := pool.Begin(ctx)
				if err != nil {
					return "begin", err
				}
				if _, err := tx.Exec(ctx, "select pg_notify($1, $2)", listenChan, "rolled-back-"+payload); err != nil {
					tx.Rollback(ctx)
					return "notify in rolled-back transaction", err
				}
				if err := tx.Rollback(ctx); err != nil {
					return "rollback", err
				}
				// Another channel, never listened to.
				if _, err := pool.Exec(ctx, "select pg_notify($1, $2)", otherChan, "other-"+payload); err != nil {
					return "notify on other channel", err
				}
				return "", nil
			}()
			if err != nil {
				f.add("sender %s: %v", step, err)
				return
			}
		}
	})
	f.report(t, "senders")

	// Wait until both listeners have everything (or the deadline), then a
	// grace period for duplicates and stray notifications.
	waitAll := func(ls []*listener, payloads []string, limit time.Duration) bool {
		end := time.Now().Add(limit)
		for time.Now().Before(end) {
			all := true
			for _, l := range ls {
				for _, p := range payloads {
					if l.count(p) == 0 {
						all = false
					}
				}
				l.mu.Lock()
				failed := l.err != nil
				l.mu.Unlock()
				if failed {
					return false
				}
			}
			if all {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return false
	}
	waitAll(listeners, expected, 20*time.Second)
	time.Sleep(time.Second)

	checkListener := func(l *listener, want []string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			t.Errorf("%v", l.err)
		}
		wantSet := map[string]bool{}
		var missing, dup []string
		for _, p := range want {
			wantSet[p] = true
			switch n := l.got[p]; {
			case n == 0:
				missing = append(missing, p)
			case n > 1:
				dup = append(dup, fmt.Sprintf("%s x%d", p, n))
			}
		}
		var extra []string
		for _, p := range sortedKeys(l.got) {
			if !wantSet[p] {
				extra = append(extra, p)
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s: %d of %d notifications never arrived, e.g. %v", l.name, len(missing), len(want), head(missing))
		}
		if len(dup) > 0 {
			t.Errorf("%s: notifications delivered more than once: %v", l.name, head(dup))
		}
		if len(extra) > 0 {
			t.Errorf("%s: unexpected notifications (rolled back or after UNLISTEN): %v", l.name, head(extra))
		}
		if len(l.wrong) > 0 {
			t.Errorf("%s: notifications on channels it does not listen to: %v", l.name, head(l.wrong))
		}
		if l.txns == 0 {
			t.Errorf("%s ran no transactions while listening", l.name)
		}
	}
	stopListeners()
	for _, l := range listeners {
		checkListener(l, expected)
	}
	if t.Failed() {
		return
	}

	// UNLISTEN on listener A (between its transactions): later
	// notifications reach B only.
	a, b := listeners[0], listeners[1]
	{
		ctx, cancel := opCtx()
		_, err := a.conn.Exec(ctx, "unlisten "+listenChan)
		cancel()
		if err != nil {
			t.Fatalf("UNLISTEN: %v", err)
		}
	}
	for _, l := range listeners {
		l.stopFlag = false
		lwg.Add(1)
		go func(l *listener) { defer lwg.Done(); l.run(deadline) }(l)
	}
	var after []string
	for i := 0; i < 5; i++ {
		p := fmt.Sprintf("after-unlisten-%d", i)
		after = append(after, p)
		ctx, cancel := opCtx()
		_, err := pool.Exec(ctx, "select pg_notify($1, $2)", listenChan, p)
		cancel()
		if err != nil {
			t.Errorf("notify after UNLISTEN: %v", err)
		}
	}
	if !waitAll([]*listener{b}, after, 15*time.Second) {
		t.Errorf("listener B did not receive the notifications sent after A's UNLISTEN")
	}
	time.Sleep(time.Second)
	stopListeners()
	checkListener(a, expected)
	checkListener(b, append(append([]string{}, expected...), after...))
}

func head(s []string) []string {
	if len(s) > 5 {
		return append(s[:5:5], "...")
	}
	return s
}

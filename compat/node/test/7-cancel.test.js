'use strict'
// Scenario 7: cancelling a long query. node-postgres has no public cancel API,
// so the main check is a statement_timeout (SET LOCAL in a transaction, and a
// session-level SET); the query must end with 57014 within a few seconds and
// the same connection must work afterwards. Two out-of-band cancels are also
// checked: pg_cancel_backend() from another connection, and the CancelRequest
// that pg's (undocumented) Client#cancel sends with the backend key data.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { pg, connect, closeClient, closeAll, q, sleep } = require('./lib')

after(closeAll)

// Runs `query` expecting 57014 within `ms`; returns the elapsed milliseconds.
async function expectCanceled(c, query, ms = 8000) {
  const t0 = Date.now()
  let err
  try {
    await q(c, query, undefined, ms)
  } catch (e) {
    err = e
  }
  const elapsed = Date.now() - t0
  assert.ok(err, `${query} was not cancelled (finished after ${elapsed} ms)`)
  assert.equal(err.code, '57014', `expected 57014 query_canceled, got ${err.code}: ${err.message}`)
  return elapsed
}

// Waits until PostgreSQL itself (COMPAT_DIRECT_PORT, bypassing the server
// under test) shows `sql` running, so that a cancel cannot arrive while the
// query is still queued in the pooler.
async function waitRunning(sql) {
  const direct = await connect({ port: Number(process.env.COMPAT_DIRECT_PORT) })
  try {
    const deadline = Date.now() + 5000
    for (;;) {
      const r = await q(
        direct,
        "select count(*)::int as n from pg_stat_activity where state = 'active' and query = $1",
        [sql],
      )
      if (r.rows[0].n > 0) return
      if (Date.now() > deadline) throw new Error(`${sql} did not start running within 5 s`)
      await sleep(20)
    }
  } finally {
    await closeClient(direct)
  }
}

async function assertWorks(c) {
  for (let i = 0; i < 5; i++) {
    await q(c, 'begin')
    const r = await q(c, 'select $1::int * 2 as v', [i])
    assert.equal(r.rows[0].v, i * 2)
    await q(c, 'commit')
  }
}

test('SET LOCAL statement_timeout cancels pg_sleep(30) with 57014; the connection works after', { timeout: 30000 }, async () => {
  const c = await connect()
  try {
    const defaultTimeout = (await q(c, 'show statement_timeout')).rows[0].statement_timeout
    await q(c, 'begin')
    await q(c, "set local statement_timeout = '500ms'")
    const elapsed = await expectCanceled(c, 'select pg_sleep(30)')
    assert.ok(elapsed < 5000, `cancelled after ${elapsed} ms`)
    await q(c, 'rollback')
    await assertWorks(c)
    assert.equal((await q(c, 'show statement_timeout')).rows[0].statement_timeout, defaultTimeout)
    // A second time, with a named statement around it.
    await q(c, 'begin')
    await q(c, "set local statement_timeout = '300ms'")
    assert.equal((await q(c, { name: 'compat_sleep', text: 'select pg_sleep($1::float8)', values: [0] })).rowCount, 1)
    await expectCanceled(c, { name: 'compat_sleep', text: 'select pg_sleep($1::float8)', values: [30] })
    await q(c, 'rollback')
    await assertWorks(c)
  } finally {
    await closeClient(c)
  }
})

test('session statement_timeout cancels pg_sleep(30) outside a transaction', { timeout: 30000 }, async () => {
  const c = await connect()
  try {
    await q(c, "set statement_timeout = '500ms'")
    const elapsed = await expectCanceled(c, 'select pg_sleep(30)')
    assert.ok(elapsed < 5000, `cancelled after ${elapsed} ms`)
    await q(c, 'reset statement_timeout')
    await assertWorks(c)
  } finally {
    await closeClient(c)
  }
})

test('pg_cancel_backend from another connection cancels pg_sleep(30)', { timeout: 30000 }, async () => {
  const c = await connect()
  const other = await connect()
  try {
    await q(c, 'begin')
    const pid = (await q(c, 'select pg_backend_pid() as pid')).rows[0].pid
    const sql = 'select pg_sleep(30) /* compat_node pg_cancel_backend */'
    const sleeping = expectCanceled(c, sql)
    sleeping.catch(() => {})
    await waitRunning(sql)
    const r = await q(other, 'select pg_cancel_backend($1) as ok', [pid])
    assert.equal(r.rows[0].ok, true)
    const elapsed = await sleeping
    assert.ok(elapsed < 5000, `cancelled after ${elapsed} ms`)
    await q(c, 'rollback')
    await assertWorks(c)
  } finally {
    await closeClient(c)
    await closeClient(other)
  }
})

// What pg's Client#cancel does (without its deprecated `activeQuery` access):
// a new connection that sends CancelRequest(processID, secretKey) from the
// client's BackendKeyData.
function sendCancelRequest(c) {
  assert.ok(c.processID !== null && c.secretKey !== null, 'BackendKeyData received')
  const con = new pg.Connection()
  con.on('error', () => {})
  con.on('connect', () => con.cancel(c.processID, c.secretKey))
  con.connect(c.port, c.host)
}

test('CancelRequest with the backend key data (as pg Client#cancel sends it) cancels pg_sleep(30), and only it', { timeout: 30000 }, async () => {
  const c = await connect()
  // Other clients keep the remaining server connections busy meanwhile; none
  // of their queries may be the one cancelled.
  let busy = true
  const others = await Promise.all(Array.from({ length: 6 }, () => connect()))
  const bystanders = Promise.all(
    others.map(async (o, k) => {
      let n = 0
      while (busy) {
        await q(o, 'begin')
        const r = await q(o, 'select $1::int as v, pg_sleep(0.02)', [n])
        assert.equal(r.rows[0].v, n)
        await q(o, 'commit')
        n++
      }
      await closeClient(o)
      return `${k}:${n}`
    }),
  )
  bystanders.catch(() => {})
  try {
    for (const inTx of [false, true]) {
      if (inTx) await q(c, 'begin')
      const sql = `select pg_sleep(30) /* compat_node CancelRequest ${inTx} */`
      const sleeping = expectCanceled(c, sql)
      sleeping.catch(() => {})
      await waitRunning(sql)
      sendCancelRequest(c)
      const elapsed = await sleeping
      assert.ok(elapsed < 5000, `cancelled after ${elapsed} ms`)
      if (inTx) await q(c, 'rollback')
      await assertWorks(c)
    }
    busy = false
    await bystanders // rejects if a bystander's query failed (e.g. was cancelled)
  } finally {
    busy = false
    await closeClient(c)
  }
})

'use strict'
// Scenario 8: PostgreSQL restarted (pg_ctl restart -m fast) while workers run
// transactions. Errors during the restart window are allowed (the workers
// retry with backoff); within 20 s after the restart every worker must
// complete transactions again, including with named statements the driver
// prepared before the restart.
//
// Half the workers hold their own pg.Client and only replace it when the
// connection itself is gone (a server error such as "prepared statement does
// not exist" keeps the client, so its cached statements must keep working);
// the other half use a pg.Pool, which drops broken clients by itself.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { execFile } = require('node:child_process')
const { connect, closeClient, closeAll, pool, closePool, q, eq, sleep, waitFor, describe, resetSchemas, exec } = require('./lib')

const SCHEMA = 'compat_node_s8'
const WORKERS = 8
const RECOVERY_MS = 20000
const AFTER_RESTART = 5 // transactions each worker must complete after the restart

after(closeAll)

function restartPostgres() {
  const cmd = process.env.COMPAT_RESTART_CMD
  assert.ok(cmd, 'COMPAT_RESTART_CMD is set')
  return new Promise((resolve, reject) => {
    execFile('sh', ['-c', cmd], { timeout: 90000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`restart failed: ${err.message}\n${stdout}${stderr}`))
      else resolve()
    })
  })
}

// An error that means the connection is unusable (as opposed to an error the
// server reported on a live connection).
function connectionLost(err, client) {
  if (!client || client.socketError || client._ending || client._ended || !client._queryable) return true
  const code = err && err.code
  return !code || /^(08|57P0)/.test(code)
}

const STMT = { name: 'compat_restart_tick', text: 'select $1::int + 1 as v' }

// One transaction: the named statement (or the same SQL unnamed), then an
// unnamed parameterized insert.
async function tick(c, w, n, named, table) {
  await q(c, 'begin', undefined, 5000)
  const r = named ? await q(c, { ...STMT, values: [n] }, undefined, 5000) : await q(c, STMT.text, [n], 5000)
  eq(r.rows[0].v, n + 1, `${STMT.text} with ${n}`)
  await q(c, `insert into ${SCHEMA}.${table} (worker, n) values ($1, $2)`, [w, n], 5000)
  await q(c, 'commit', undefined, 5000)
}

function report(state) {
  return state
    .map((s, w) => `worker ${w} (${w % 2 === 0 ? 'own client' : 'pool'}): ${s.ok} ok (${s.okAfter} after the restart), last error: ${s.lastError}`)
    .join('\n  ')
}

async function restartUnderLoad(t, table, named) {
  await exec(`create table ${SCHEMA}.${table} (worker int not null, n int not null)`)

  const p = pool({ max: WORKERS / 2, connectionTimeoutMillis: 5000 })
  const state = Array.from({ length: WORKERS }, () => ({
    ok: 0,
    okAfter: 0,
    errors: [],
    lastError: null,
    // held-client workers: did a client that prepared STMT before the
    // restart complete a transaction after it?
    survivorOk: 0,
  }))
  let restartStartedAt = null
  let restartedAt = null
  let stop = false

  const worker = async (w) => {
    const s = state[w]
    const held = w % 2 === 0
    let client = null
    let preparedBeforeRestart = false
    let backoff = 50
    let n = 0
    while (!stop) {
      const startedBeforeRestart = restartStartedAt === null
      const startedAfterRestart = restartedAt !== null
      let c = null
      try {
        if (held) {
          if (!client) {
            client = await connect({ connectionTimeoutMillis: 5000 })
            preparedBeforeRestart = false
          }
          c = client
        } else {
          c = await p.connect()
        }
        await tick(c, w, n++, named, table)
        s.ok++
        if (startedAfterRestart) {
          s.okAfter++
          if (held && preparedBeforeRestart) s.survivorOk++
        } else if (held && startedBeforeRestart) {
          preparedBeforeRestart = true
        }
        if (!held) c.release()
        backoff = 50
      } catch (err) {
        s.errors.push(describe(err))
        s.lastError = describe(err)
        const lost = connectionLost(err, c)
        if (held) {
          if (lost && client) {
            closeClient(client).catch(() => {})
            client = null
          } else if (client) {
            // A live connection after a server error: roll back, keep it.
            await q(client, 'rollback', undefined, 5000).catch(() => {})
          }
        } else if (c) {
          if (!lost) await q(c, 'rollback', undefined, 5000).catch(() => {})
          c.release(lost ? err : undefined)
        }
        await sleep(backoff)
        backoff = Math.min(backoff * 2, 1000)
      }
      await sleep(5)
    }
    if (client) await closeClient(client)
  }

  const running = Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)))
  try {
    // Warm up: every worker completes transactions (so its connections have
    // the named statement prepared) before the restart.
    await waitFor(10000, () => state.every((s) => s.ok >= 10), 'warm-up').catch(() => {
      assert.fail(`not every worker completed 10 transactions before the restart:\n  ${report(state)}`)
    })
    const errorsBefore = state.flatMap((s) => s.errors)
    assert.equal(errorsBefore.length, 0, `errors before the restart: ${errorsBefore.slice(0, 5).join(' | ')}`)

    const t0 = Date.now()
    restartStartedAt = t0
    await restartPostgres()
    restartedAt = Date.now()
    t.diagnostic(`pg_ctl restart took ${restartedAt - t0} ms`)

    try {
      await waitFor(RECOVERY_MS, () => state.every((s) => s.okAfter >= AFTER_RESTART), 'every worker to recover', 50)
    } catch {
      assert.fail(`not every worker recovered within ${RECOVERY_MS} ms of the restart:\n  ${report(state)}`)
    }
    t.diagnostic(`recovered ${Date.now() - restartedAt} ms after the restart`)
  } finally {
    stop = true
    await Promise.race([running, sleep(15000)])
    await closePool(p)
  }

  const total = state.reduce((sum, s) => sum + s.ok, 0)
  const errors = state.flatMap((s) => s.errors)
  const kinds = [...new Set(errors)]
  t.diagnostic(`${total} transactions, ${errors.length} errors during the restart: ${kinds.slice(0, 6).join(' | ')}`)
  if (named) {
    const survivors = state.reduce((sum, s) => sum + s.survivorOk, 0)
    t.diagnostic(`transactions after the restart on held clients that prepared the statement before it: ${survivors}`)
  }
  // Every transaction the workers saw committed is there (a COMMIT whose
  // reply was lost in the restart may have committed too).
  const r = await exec(`select count(*)::int as n from ${SCHEMA}.${table}`)
  assert.ok(r.rows[0].n >= total, `${r.rows[0].n} rows for ${total} committed transactions`)
  assert.ok(r.rows[0].n <= total + errors.length, `${r.rows[0].n} rows, at most ${total + errors.length} expected`)
}

test('PostgreSQL restarted under load (unnamed statements): every worker recovers within 20 s', { timeout: 100000 }, async (t) => {
  await resetSchemas(SCHEMA)
  await restartUnderLoad(t, 'ticks_unnamed', false)
})

test('PostgreSQL restarted under load (named statements prepared before the restart): every worker recovers within 20 s', { timeout: 100000 }, async (t) => {
  await restartUnderLoad(t, 'ticks_named', true)
})

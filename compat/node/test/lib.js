'use strict'
// Shared helpers for the node-postgres compatibility suite.
//
// Connections use node-postgres' defaults: host, port, user, password and
// database come from PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE (set by the
// runner). Only timeouts are added, so that nothing can hang.

const assert = require('node:assert/strict')
const pg = require('pg')

const PREFIX = 'compat_node'
const POOL_SIZE = Number(process.env.COMPAT_POOL_SIZE || 4)
const QUERY_TIMEOUT_MS = 20000
const CONNECT_TIMEOUT_MS = 15000

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// Resolves or rejects like `promise`, or rejects after `ms` milliseconds.
function within(ms, promise, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

// Every client opened by a test file, so that `closeAll` can tear them down
// even when a test failed half-way.
const opened = new Set()

function clientConfig(extra = {}) {
  return { connectionTimeoutMillis: CONNECT_TIMEOUT_MS, ...extra }
}

// A connected pg.Client through the server under test (sluice, or PostgreSQL
// with SLUICE_COMPAT_TARGET=direct). Socket errors are recorded on the client
// instead of crashing the process; the query that was running rejects anyway.
async function connect(extra = {}) {
  const client = new pg.Client(clientConfig(extra))
  client.on('error', (err) => {
    client.socketError = err
  })
  opened.add(client)
  client.once('end', () => opened.delete(client))
  await within(CONNECT_TIMEOUT_MS + 1000, client.connect(), 'connect')
  return client
}

// A pg.Pool through the server under test.
function pool(extra = {}) {
  const p = new pg.Pool(clientConfig(extra))
  // Idle clients whose socket dies emit 'error' on the pool; checked-out
  // clients emit it on themselves: neither must crash the process.
  p.on('error', () => {})
  p.on('connect', (client) => client.on('error', () => {}))
  return p
}

async function closeClient(client) {
  try {
    await within(5000, client.end(), 'client.end')
  } catch {
    if (client.connection && client.connection.stream) client.connection.stream.destroy()
  }
  opened.delete(client)
}

async function closeAll() {
  await Promise.all([...opened].map(closeClient))
}

async function closePool(p) {
  try {
    await within(5000, p.end(), 'pool.end')
  } catch {
    // leave it to --test-force-exit
  }
}

// client.query with a client-side deadline. `query` is a string or a query
// config ({ name, text, values }).
function q(client, query, values, ms = QUERY_TIMEOUT_MS) {
  const what = typeof query === 'string' ? query : query.name ? `${query.name}: ${query.text}` : query.text
  return within(ms, values === undefined ? client.query(query) : client.query(query, values), what)
}

// Runs `sql` expecting it to fail with SQLSTATE `code`; returns the error.
async function expectError(client, query, values, code) {
  let result
  try {
    result = await q(client, query, values)
  } catch (err) {
    if (err.code !== code) {
      throw new Error(`expected SQLSTATE ${code} from ${JSON.stringify(query)}, got ${describe(err)}`)
    }
    return err
  }
  throw new Error(`expected SQLSTATE ${code} from ${JSON.stringify(query)}, but it succeeded (${result.command})`)
}

function describe(err) {
  if (!err) return String(err)
  if (err.errors && err.errors.length) {
    // AggregateError from a failed connect (e.g. ECONNREFUSED on ::1 and 127.0.0.1)
    return err.errors.map(describe).join('; ')
  }
  return err.code ? `${err.code}: ${err.message}` : err.message || String(err)
}

// Runs `n` workers concurrently (each `fn(workerIndex)`), waits for all of
// them and throws one error listing every failed worker.
async function runWorkers(n, fn) {
  const results = await Promise.allSettled(Array.from({ length: n }, (_, w) => fn(w)))
  const failures = []
  results.forEach((r, w) => {
    if (r.status === 'rejected') failures.push(`worker ${w}: ${describe(r.reason)}`)
  })
  if (failures.length) {
    // One line per kind of failure (numbers ignored), with an example.
    const kinds = new Map()
    for (const f of failures) {
      const key = f.replace(/\d+/g, 'N')
      const k = kinds.get(key) || { example: f, count: 0 }
      k.count++
      kinds.set(key, k)
    }
    const lines = [...kinds.values()].map((k) => (k.count > 1 ? `${k.example}  (and ${k.count - 1} more like it)` : k.example))
    throw new Error(`${failures.length} of ${n} workers failed:\n  ${lines.slice(0, 10).join('\n  ')}`)
  }
  return results.map((r) => r.value)
}

// Wraps a worker's error with where it happened.
function at(worker, iteration, err) {
  const e = new Error(`iteration ${iteration}: ${describe(err)}`)
  e.cause = err
  return e
}

// assert.equal with a one-line message that names the check and both values.
function eq(actual, expected, what) {
  if (actual !== expected) {
    throw new assert.AssertionError({
      message: `${what}: got ${JSON.stringify(actual)}, expected ${JSON.stringify(expected)}`,
    })
  }
}

// Drops and re-creates the schemas (through the server under test).
async function resetSchemas(...names) {
  const c = await connect()
  try {
    for (const name of names) {
      await q(c, `drop schema if exists ${name} cascade`)
      await q(c, `create schema ${name}`)
    }
  } finally {
    await closeClient(c)
  }
}

// Runs one statement on its own short-lived connection.
async function exec(sql, values) {
  const c = await connect()
  try {
    return await q(c, sql, values)
  } finally {
    await closeClient(c)
  }
}

// Starts `n` clients that keep running short transactions until the returned
// stop() is awaited, so that a client under test does not keep getting the
// same server connection from the pooler. stop() rejects if one of them failed.
async function churn(n) {
  let running = true
  const clients = await Promise.all(Array.from({ length: n }, () => connect()))
  const loops = Promise.all(
    clients.map(async (c, k) => {
      let i = 0
      try {
        while (running) {
          await q(c, 'begin')
          const r = await q(c, 'select $1::int as v, pg_sleep(0.002)', [i])
          eq(r.rows[0].v, i, `churn client ${k}`)
          await q(c, 'commit')
          i++
        }
      } finally {
        await closeClient(c)
      }
    }),
  )
  loops.catch(() => {})
  return async () => {
    running = false
    await loops
  }
}

// Waits until `cond()` is true, polling every `step` ms, or throws after `ms`.
async function waitFor(ms, cond, what, step = 20) {
  const deadline = Date.now() + ms
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`)
    await sleep(step)
  }
}

module.exports = {
  pg,
  PREFIX,
  POOL_SIZE,
  sleep,
  within,
  connect,
  pool,
  clientConfig,
  closeClient,
  closeAll,
  closePool,
  q,
  expectError,
  describe,
  eq,
  runWorkers,
  at,
  resetSchemas,
  exec,
  churn,
  waitFor,
}

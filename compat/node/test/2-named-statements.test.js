'use strict'
// Scenario 2: node-postgres named queries. `client.query({ name, text, values })`
// sends Parse for `name` once per connection and afterwards only Bind/Execute
// against the statement it believes exists on "its" server session. Through a
// transaction pooler every later transaction may land on another server.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { connect, closeClient, closeAll, q, expectError, eq, runWorkers, at, resetSchemas, exec, churn } = require('./lib')

const SCHEMA = 'compat_node_s2'
const WORKERS = 16
const ITERATIONS = 100

after(closeAll)

// Counts the Parse messages the driver sends, per statement name, so that the
// tests can assert that statements really are prepared once and reused.
function countParses(client) {
  const counts = new Map()
  const con = client.connection
  const parse = con.parse.bind(con)
  con.parse = (query) => {
    counts.set(query.name || '', (counts.get(query.name || '') || 0) + 1)
    return parse(query)
  }
  return counts
}

test('16 workers reuse named statements across many transactions', { timeout: 90000 }, async () => {
  await resetSchemas(SCHEMA)
  await exec(`create table ${SCHEMA}.log (worker int, i int, s text, primary key (worker, i))`)

  await runWorkers(WORKERS, async (w) => {
    const c = await connect()
    const parses = countParses(c)
    // The same name for different texts on different connections: each
    // connection must get its own statement.
    const scaledText = w % 2 === 0 ? 'select $1::int * 2 as v' : 'select $1::int * 3 as v'
    const factor = w % 2 === 0 ? 2 : 3
    try {
      for (let i = 0; i < ITERATIONS; i++) {
        try {
          await q(c, 'begin')
          // Same SQL text, same name, prepared by every connection.
          let r = await q(c, { name: 'compat_add_one', text: 'select $1::int + 1 as v', values: [i] })
          eq(r.rows[0].v, i + 1, `compat_add_one(${i})`)
          // A second, different SQL text.
          r = await q(c, { name: 'compat_concat', text: 'select $1::text || $2::text as s', values: [`w${w}-`, `${i}`] })
          eq(r.rows[0].s, `w${w}-${i}`, 'compat_concat')
          r = await q(c, { name: 'compat_scaled', text: scaledText, values: [i] })
          eq(r.rows[0].v, i * factor, `compat_scaled(${i}) = ${scaledText}`)
          r = await q(c, {
            name: 'compat_log',
            text: `insert into ${SCHEMA}.log (worker, i, s) values ($1, $2, $3)`,
            values: [w, i, `w${w}-${i}`],
          })
          eq(r.rowCount, 1, 'compat_log row count')
          await q(c, 'commit')

          if (i % 10 === 3) {
            // Outside a transaction (autocommit).
            r = await q(c, { name: 'compat_add_one', text: 'select $1::int + 1 as v', values: [-i] })
            eq(r.rows[0].v, 1 - i, `compat_add_one(${-i}) in autocommit`)
          }
          if (i % 7 === 5) {
            // Inside a transaction that is rolled back.
            await q(c, 'begin')
            r = await q(c, { name: 'compat_scaled', text: scaledText, values: [i + 1] })
            eq(r.rows[0].v, (i + 1) * factor, `compat_scaled(${i + 1}) = ${scaledText}`)
            await q(c, 'rollback')
          }
        } catch (err) {
          throw at(w, i, err)
        }
      }
      for (const name of ['compat_add_one', 'compat_concat', 'compat_scaled', 'compat_log']) {
        assert.equal(parses.get(name), 1, `driver sent Parse for ${name} once on worker ${w}`)
      }
    } finally {
      await closeClient(c)
    }
  })

  const r = await exec(
    `select count(*)::int as n, count(*) filter (where s = 'w' || worker || '-' || i)::int as good from ${SCHEMA}.log`,
  )
  assert.equal(r.rows[0].n, WORKERS * ITERATIONS)
  assert.equal(r.rows[0].good, WORKERS * ITERATIONS)
})

test('a named statement first prepared in a rolled-back transaction stays usable', { timeout: 30000 }, async () => {
  const c = await connect()
  // Other clients keep the server pool busy, so that the transactions below
  // land on different server connections.
  const stopChurn = await churn(6)
  try {
    const stmt = (v) => ({ name: 'compat_rb_first', text: 'select $1::int * 10 as v', values: [v] })
    await q(c, 'begin')
    eq((await q(c, stmt(1))).rows[0].v, 10, 'compat_rb_first(1)')
    await q(c, 'rollback')
    for (let i = 0; i < 30; i++) {
      if (i % 2 === 0) await q(c, 'begin')
      eq((await q(c, stmt(i))).rows[0].v, i * 10, `compat_rb_first(${i})`)
      if (i % 2 === 0) await q(c, 'commit')
    }
    await stopChurn()
  } finally {
    await closeClient(c)
    await stopChurn().catch(() => {})
  }
})

test('a named statement stays usable after errors in and around it', { timeout: 30000 }, async () => {
  const c = await connect()
  // Other clients keep the server pool busy, so that the transactions below
  // land on different server connections.
  const stopChurn = await churn(6)
  try {
    const div = (v) => ({ name: 'compat_div', text: 'select 100 / $1::int as v', values: [v] })
    eq((await q(c, div(4))).rows[0].v, 25, 'compat_div(4)')
    // The statement itself fails at execution (division by zero), autocommit.
    await expectError(c, div(0), undefined, '22012')
    eq((await q(c, div(5))).rows[0].v, 20, 'compat_div(5)')
    // Fails inside a transaction; the transaction is rolled back.
    await q(c, 'begin')
    eq((await q(c, div(10))).rows[0].v, 10, 'compat_div(10)')
    await expectError(c, div(0), undefined, '22012')
    await expectError(c, div(1), undefined, '25P02')
    await q(c, 'rollback')
    // Another statement fails in the transaction.
    await q(c, 'begin')
    await expectError(c, 'select 1 / 0', undefined, '22012')
    await q(c, 'rollback')
    for (let i = 1; i <= 20; i++) {
      await q(c, 'begin')
      eq((await q(c, div(i))).rows[0].v, Math.trunc(100 / i), `compat_div(${i})`)
      await q(c, 'commit')
    }
    // A named statement that fails to parse can be defined again.
    await expectError(c, { name: 'compat_bad', text: 'select from from', values: [] }, undefined, '42601')
    assert.equal((await q(c, { name: 'compat_bad', text: 'select 7 as v', values: [] })).rows[0].v, 7)
    assert.equal((await q(c, { name: 'compat_bad', text: 'select 7 as v', values: [] })).rows[0].v, 7)
    await stopChurn()
  } finally {
    await closeClient(c)
    await stopChurn().catch(() => {})
  }
})

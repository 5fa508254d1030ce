'use strict'
// Scenario 4: session settings (SET search_path / application_name /
// statement_timeout outside a transaction) follow the client across all its
// later transactions, while concurrent clients see their own settings;
// SET LOCAL ends with its transaction and a SET in a rolled-back transaction
// is undone.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { connect, closeClient, closeAll, q, eq, runWorkers, at, resetSchemas, exec } = require('./lib')

const WORKERS = 8
const ITERATIONS = 40
const schemaOf = (w) => `compat_node_sp_${w}`

after(closeAll)

async function show(c, name) {
  const r = await q(c, `show ${name}`)
  return r.rows[0][name]
}

test('8 workers with their own search_path, application_name and statement_timeout', { timeout: 90000 }, async () => {
  const schemas = Array.from({ length: WORKERS }, (_, w) => schemaOf(w))
  await resetSchemas(...schemas)
  for (let w = 0; w < WORKERS; w++) {
    await exec(`create table ${schemaOf(w)}.t (v int not null)`)
    await exec(`insert into ${schemaOf(w)}.t (v) values (${w})`)
    await exec(`create table ${schemaOf(w)}.hits (i int not null)`)
  }

  await runWorkers(WORKERS, async (w) => {
    const c = await connect()
    try {
      const expected = {
        search_path: schemaOf(w),
        application_name: `compat_node_w${w}`,
        statement_timeout: `${w + 10}s`,
      }
      // Outside a transaction: session-level settings.
      await q(c, `set search_path to ${schemaOf(w)}`)
      await q(c, `set application_name to '${expected.application_name}'`)
      await q(c, `set statement_timeout to '${expected.statement_timeout}'`)

      const check = async (label) => {
        for (const [name, value] of Object.entries(expected)) {
          eq(await show(c, name), value, `${label}: SHOW ${name}`)
        }
        // Unqualified table names resolve through the worker's search_path.
        const r = await q(c, 'select v, $1::int as echo from t', [w])
        eq(JSON.stringify(r.rows), JSON.stringify([{ v: w, echo: w }]), `${label}: select from unqualified table t`)
      }

      for (let i = 0; i < ITERATIONS; i++) {
        try {
          const inTx = i % 2 === 1
          if (inTx) await q(c, 'begin')
          await check(inTx ? 'in a transaction' : 'autocommit')
          await q(c, 'insert into hits (i) values ($1)', [i])
          if (inTx) await q(c, 'commit')

          if (i % 5 === 0) {
            // SET LOCAL lasts until the end of its transaction only.
            await q(c, 'begin')
            await q(c, 'set local search_path to public')
            await q(c, "set local statement_timeout to '1234ms'")
            eq(await show(c, 'search_path'), 'public', 'SET LOCAL search_path')
            eq(await show(c, 'statement_timeout'), '1234ms', 'SET LOCAL statement_timeout')
            await q(c, 'commit')
            await check('after a transaction with SET LOCAL')
          }
          if (i % 7 === 0) {
            // A plain SET inside a rolled-back transaction is undone.
            await q(c, 'begin')
            await q(c, "set application_name to 'compat_node_rolled_back'")
            await q(c, 'set search_path to public')
            eq(await show(c, 'application_name'), 'compat_node_rolled_back', 'SET in the transaction')
            await q(c, 'rollback')
            await check('after a rolled-back SET')
          }
          if (i % 11 === 10) {
            // A later session SET (outside a transaction) replaces the value.
            expected.application_name = `compat_node_w${w}_i${i}`
            await q(c, `set application_name to '${expected.application_name}'`)
            await check('after a second SET')
          }
          if (i % 13 === 12) {
            // A SET inside a committed transaction persists for the session.
            expected.statement_timeout = `${w + 20}s`
            await q(c, 'begin')
            await q(c, `set statement_timeout to '${expected.statement_timeout}'`)
            await q(c, 'commit')
            await check('after a SET in a committed transaction')
          }
        } catch (err) {
          throw at(w, i, err)
        }
      }
      const r = await q(c, 'select count(*)::int as n from hits')
      eq(r.rows[0].n, ITERATIONS, 'rows in the worker\'s own hits table')
    } finally {
      await closeClient(c)
    }
  })

  for (let w = 0; w < WORKERS; w++) {
    const r = await exec(`select count(*)::int as n from ${schemaOf(w)}.hits`)
    assert.equal(r.rows[0].n, ITERATIONS, `rows in ${schemaOf(w)}.hits`)
  }
})

test('a fresh connection does not inherit settings made by other clients', { timeout: 30000 }, async () => {
  const defaults = await connect()
  const before = {
    search_path: await show(defaults, 'search_path'),
    application_name: await show(defaults, 'application_name'),
    statement_timeout: await show(defaults, 'statement_timeout'),
  }
  await closeClient(defaults)
  // Many clients change their settings and go away...
  await runWorkers(8, async (w) => {
    const c = await connect()
    try {
      await q(c, `set search_path to ${schemaOf(w)}`)
      await q(c, `set application_name to 'compat_node_leak_${w}'`)
      await q(c, "set statement_timeout to '77s'")
      await q(c, 'select 1')
    } finally {
      await closeClient(c)
    }
  })
  // ...and new clients see the defaults.
  await runWorkers(8, async () => {
    const c = await connect()
    try {
      for (let i = 0; i < 10; i++) {
        for (const [name, value] of Object.entries(before)) {
          eq(await show(c, name), value, `new connection: SHOW ${name}`)
        }
      }
    } finally {
      await closeClient(c)
    }
  })
})

'use strict'
// Scenario 1: many concurrent workers (more than the server pool) running
// parameterized queries and transactions through a pg.Pool.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { pool, closePool, closeAll, q, runWorkers, at, resetSchemas, exec } = require('./lib')

const SCHEMA = 'compat_node_s1'
const WORKERS = 24
const ITERATIONS = 200

after(closeAll)

test('24 workers x 200 parameterized queries and transactions through a pg.Pool', { timeout: 90000 }, async () => {
  await resetSchemas(SCHEMA)
  await exec(`create table ${SCHEMA}.items (worker int, i int, v bigint, primary key (worker, i))`)

  const p = pool({ max: WORKERS })
  try {
    await runWorkers(WORKERS, async (w) => {
      // Even workers hold one client for their whole run; odd ones check a
      // client out of the pool for every iteration.
      const held = w % 2 === 0 ? await p.connect() : null
      try {
        for (let i = 0; i < ITERATIONS; i++) {
          const c = held || (await p.connect())
          try {
            const r = await q(c, 'select $1::int + 1 as v, $2::text as who', [i, `w${w}`])
            assert.equal(r.rows[0].v, i + 1)
            assert.equal(r.rows[0].who, `w${w}`)
            if (i % 2 === 0) {
              await q(c, 'begin')
              const ins = await q(c, `insert into ${SCHEMA}.items (worker, i, v) values ($1, $2, $3)`, [w, i, i * w])
              assert.equal(ins.rowCount, 1)
              const n = await q(c, `select count(*)::int as n from ${SCHEMA}.items where worker = $1`, [w])
              assert.equal(n.rows[0].n, i / 2 + 1, 'own committed + uncommitted rows visible inside the transaction')
              await q(c, 'commit')
            }
          } catch (err) {
            throw at(w, i, err)
          } finally {
            if (!held) c.release()
          }
        }
      } finally {
        if (held) held.release()
      }
    })
  } finally {
    await closePool(p)
  }

  const r = await exec(
    `select count(*)::int as n, count(distinct worker)::int as workers, sum(v)::bigint as s from ${SCHEMA}.items`,
  )
  const perWorker = ITERATIONS / 2
  let expectedSum = 0
  for (let w = 0; w < WORKERS; w++) for (let i = 0; i < ITERATIONS; i += 2) expectedSum += i * w
  assert.equal(r.rows[0].n, WORKERS * perWorker)
  assert.equal(r.rows[0].workers, WORKERS)
  assert.equal(Number(r.rows[0].s), expectedSum)
})

'use strict'
// Scenario 6: COPY FROM STDIN and COPY TO STDOUT with pg-copy-streams.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { Readable, Writable } = require('node:stream')
const { pipeline } = require('node:stream/promises')
const { from: copyFrom, to: copyTo } = require('pg-copy-streams')
const { connect, closeClient, closeAll, q, expectError, within, runWorkers, resetSchemas, exec } = require('./lib')

const SCHEMA = 'compat_node_s6'
const ROWS = 5000

after(closeAll)

// Text-format COPY lines, with escapes: a tab, a backslash and a NULL.
function line(i) {
  const name = i % 100 === 0 ? `tab\\there ${i}` : i % 101 === 0 ? `back\\\\slash ${i}` : `name-${i}-é`
  const note = i % 7 === 0 ? '\\N' : `n${i}`
  return `${i}\t${name}\t${note}\n`
}

// COPY FROM STDIN, the data sent in chunks of `perChunk` lines.
async function copyIn(c, sql, lines, perChunk = 250) {
  const chunks = []
  for (let k = 0; k < lines.length; k += perChunk) chunks.push(lines.slice(k, k + perChunk).join(''))
  const stream = c.query(copyFrom(sql))
  await within(30000, pipeline(Readable.from(chunks), stream), sql)
  return stream.rowCount
}

// COPY TO STDOUT, returning the whole output as a string.
async function copyOut(c, sql) {
  const buffers = []
  const sink = new Writable({
    write(chunk, _enc, done) {
      buffers.push(chunk)
      done()
    },
  })
  await within(30000, pipeline(c.query(copyTo(sql)), sink), sql)
  return Buffer.concat(buffers).toString('utf8')
}

test('COPY FROM STDIN of 5000 rows and COPY TO STDOUT of them', { timeout: 60000 }, async () => {
  await resetSchemas(SCHEMA)
  await exec(`create table ${SCHEMA}.items (id int primary key, name text not null, note text)`)
  const c = await connect()
  try {
    const lines = Array.from({ length: ROWS }, (_, i) => line(i))
    const copied = await copyIn(c, `copy ${SCHEMA}.items (id, name, note) from stdin`, lines)
    assert.equal(copied, ROWS, 'COPY row count')

    let r = await q(c, `select count(*)::int as n, sum(id)::bigint as s, count(note)::int as notes from ${SCHEMA}.items`)
    assert.equal(r.rows[0].n, ROWS)
    assert.equal(Number(r.rows[0].s), (ROWS * (ROWS - 1)) / 2)
    assert.equal(r.rows[0].notes, ROWS - Math.ceil(ROWS / 7), 'NULLs from \\N')
    r = await q(c, `select id, name, note from ${SCHEMA}.items where id = any($1::int[]) order by id`, [[100, 101, 7, 8]])
    assert.deepEqual(r.rows, [
      { id: 7, name: 'name-7-é', note: null },
      { id: 8, name: 'name-8-é', note: 'n8' },
      { id: 100, name: 'tab\there 100', note: 'n100' },
      { id: 101, name: 'back\\slash 101', note: 'n101' },
    ])

    const out = await copyOut(c, `copy (select id, name, note from ${SCHEMA}.items order by id) to stdout`)
    assert.equal(out, lines.join(''), 'COPY TO output equals what was copied in')

    // The connection is fine afterwards, in and out of transactions.
    await q(c, 'begin')
    r = await q(c, 'select $1::int as v', [42])
    assert.equal(r.rows[0].v, 42)
    await q(c, 'commit')
  } finally {
    await closeClient(c)
  }
})

test('COPY TO STDOUT of 100000 generated rows (many CopyData messages)', { timeout: 60000 }, async () => {
  const c = await connect()
  try {
    const out = await copyOut(c, 'copy (select g, md5(g::text) from generate_series(1, 100000) g) to stdout')
    const rows = out.split('\n')
    assert.equal(rows.pop(), '', 'output ends with a newline')
    assert.equal(rows.length, 100000)
    assert.equal(rows[0].split('\t')[0], '1')
    assert.equal(rows[99999].split('\t')[0], '100000')
    assert.equal(rows.reduce((s, row) => s + Number(row.split('\t')[0]), 0), (100000 * 100001) / 2)
    assert.equal((await q(c, 'select 1 as one')).rows[0].one, 1)
  } finally {
    await closeClient(c)
  }
})

test('COPY in a rolled-back transaction, a failing COPY, and concurrent COPYs', { timeout: 60000 }, async () => {
  await exec(`create table ${SCHEMA}.more (id int primary key, name text not null, note text)`)
  const c = await connect()
  try {
    // Inside a transaction that is rolled back: nothing stays.
    await q(c, 'begin')
    const copied = await copyIn(
      c,
      `copy ${SCHEMA}.more (id, name, note) from stdin`,
      Array.from({ length: 300 }, (_, i) => line(i)),
    )
    assert.equal(copied, 300)
    assert.equal((await q(c, `select count(*)::int as n from ${SCHEMA}.more`)).rows[0].n, 300)
    await q(c, 'rollback')
    assert.equal((await q(c, `select count(*)::int as n from ${SCHEMA}.more`)).rows[0].n, 0)

    // Bad data: the COPY fails with 22P02 and the connection recovers.
    const bad = [line(1), line(2), 'not-a-number\tx\ty\n', line(4)]
    let err
    try {
      await copyIn(c, `copy ${SCHEMA}.more (id, name, note) from stdin`, bad, 1)
    } catch (e) {
      err = e
    }
    assert.ok(err, 'COPY with bad data failed')
    assert.equal(err.code, '22P02', `COPY error: ${err.message}`)
    assert.equal((await q(c, 'select 2 as two')).rows[0].two, 2)
    assert.equal((await q(c, `select count(*)::int as n from ${SCHEMA}.more`)).rows[0].n, 0)

    // A failing COPY inside a transaction: the transaction is aborted.
    await q(c, 'begin')
    await q(c, `insert into ${SCHEMA}.more (id, name) values (-1, 'x')`)
    await expectError(c, `copy ${SCHEMA}.more (id, name, note) from '/nonexistent/compat_node'`, undefined, '42501')
    await q(c, 'rollback')
    assert.equal((await q(c, `select count(*)::int as n from ${SCHEMA}.more`)).rows[0].n, 0)
  } finally {
    await closeClient(c)
  }

  // Six clients COPY at the same time (more than the server pool).
  const PER = 1000
  await runWorkers(6, async (w) => {
    const cc = await connect()
    try {
      const lines = Array.from({ length: PER }, (_, i) => line(w * PER + i))
      assert.equal(await copyIn(cc, `copy ${SCHEMA}.more (id, name, note) from stdin`, lines, 100), PER)
      const out = await copyOut(
        cc,
        `copy (select id, name, note from ${SCHEMA}.more where id >= ${w * PER} and id < ${(w + 1) * PER} order by id) to stdout`,
      )
      assert.equal(out, lines.join(''))
    } finally {
      await closeClient(cc)
    }
  })
  const r = await exec(`select count(*)::int as n, count(distinct id)::int as d from ${SCHEMA}.more`)
  assert.deepEqual(r.rows[0], { n: 6 * PER, d: 6 * PER })
})

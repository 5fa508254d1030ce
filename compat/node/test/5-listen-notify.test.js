'use strict'
// Scenario 5: LISTEN/NOTIFY. A listening client receives every notification
// committed by other clients exactly once (also while it runs transactions
// itself), never one from a rolled-back transaction, and nothing after
// UNLISTEN.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { connect, closeClient, closeAll, q, runWorkers, at, sleep, waitFor } = require('./lib')

const CHAN = 'compat_node_chan'
const OTHER = 'compat_node_other'
const NOTIFIERS = 4
const PER_NOTIFIER = 30

after(closeAll)

function collect(client) {
  const got = []
  client.on('notification', (msg) => got.push({ channel: msg.channel, payload: msg.payload }))
  return got
}

function tally(list) {
  const counts = new Map()
  for (const p of list) counts.set(p, (counts.get(p) || 0) + 1)
  return counts
}

// Asserts that `got` holds each of `expected` exactly once and nothing else.
function assertExactlyOnce(got, expected, label) {
  const counts = tally(got)
  const missing = expected.filter((p) => !counts.has(p))
  const duplicated = [...counts].filter(([, n]) => n > 1).map(([p, n]) => `${p} x${n}`)
  const wanted = new Set(expected)
  const unexpected = [...counts.keys()].filter((p) => !wanted.has(p))
  assert.ok(
    missing.length === 0 && duplicated.length === 0 && unexpected.length === 0,
    `${label}: ${got.length} received, ${expected.length} expected; ` +
      `missing ${missing.length} [${missing.slice(0, 5)}], duplicated [${duplicated.slice(0, 5)}], ` +
      `unexpected [${unexpected.slice(0, 5)}]`,
  )
}

test('LISTEN receives committed notifications exactly once, none rolled back, none after UNLISTEN', { timeout: 60000 }, async () => {
  const listener = await connect()
  const other = await connect()
  const got = collect(listener)
  const gotOther = collect(other)
  try {
    await q(listener, `listen ${CHAN}`)
    await q(other, `listen ${OTHER}`)

    const expected = []
    const expectedOther = []
    let notifying = true

    // The listener keeps running its own transactions meanwhile.
    const busy = (async () => {
      let i = 0
      while (notifying) {
        await q(listener, 'begin')
        const r = await q(listener, 'select $1::int + 1 as v', [i])
        assert.equal(r.rows[0].v, i + 1)
        await q(listener, 'commit')
        await q(listener, 'select 1')
        i++
        await sleep(2)
      }
      // And notifies itself from a transaction of its own.
      await q(listener, 'begin')
      await q(listener, `notify ${CHAN}, 'self-1'`)
      await q(listener, 'commit')
      return i
    })()
    busy.catch(() => {}) // awaited below; do not report it as unhandled meanwhile
    expected.push('self-1')

    try {
      await runWorkers(NOTIFIERS, async (w) => {
        const c = await connect()
        try {
          for (let i = 0; i < PER_NOTIFIER; i++) {
            const payload = `w${w}-${i}`
            try {
              switch (i % 3) {
                case 0: // NOTIFY in an explicit transaction
                  await q(c, 'begin')
                  await q(c, `notify ${CHAN}, '${payload}'`)
                  await q(c, 'commit')
                  break
                case 1: // pg_notify outside a transaction
                  await q(c, 'select pg_notify($1, $2)', [CHAN, payload])
                  break
                default: // pg_notify in an explicit transaction, plus the other channel
                  await q(c, 'begin')
                  await q(c, 'select pg_notify($1, $2)', [CHAN, payload])
                  await q(c, 'select pg_notify($1, $2)', [OTHER, payload])
                  await q(c, 'commit')
                  expectedOther.push(payload)
              }
              expected.push(payload)
              if (i % 5 === 0) {
                // Rolled back: never delivered.
                await q(c, 'begin')
                await q(c, `notify ${CHAN}, 'rolled-back-${payload}'`)
                await q(c, 'select pg_notify($1, $2)', [OTHER, `rolled-back-${payload}`])
                await q(c, 'rollback')
              }
            } catch (err) {
              throw at(w, i, err)
            }
          }
        } finally {
          await closeClient(c)
        }
      })
    } finally {
      notifying = false
    }
    const listenerTransactions = await busy
    assert.ok(listenerTransactions > 0)

    const payloads = () => got.map((n) => n.payload)
    // Wait (bounded) for everything to arrive; the assertions below say what is missing.
    await waitFor(
      10000,
      () => got.length >= expected.length && gotOther.length >= expectedOther.length,
      'the notifications',
    ).catch(() => {})
    await sleep(500) // duplicates or late ones would show up here
    assert.ok(
      got.every((n) => n.channel === CHAN),
      `listener got other channels: ${[...new Set(got.map((n) => n.channel))]}`,
    )
    assertExactlyOnce(payloads(), expected, `notifications on ${CHAN}`)
    assert.ok(gotOther.every((n) => n.channel === OTHER))
    assertExactlyOnce(
      gotOther.map((n) => n.payload),
      expectedOther,
      `notifications on ${OTHER}`,
    )

    // After UNLISTEN nothing more arrives on the listener; the other client,
    // still listening on its channel, serves as the "it has been delivered"
    // marker.
    await q(listener, `unlisten ${CHAN}`)
    const countBefore = got.length
    const otherBefore = gotOther.length
    const n = await connect()
    try {
      for (let i = 0; i < 10; i++) {
        await q(n, 'select pg_notify($1, $2)', [CHAN, `after-unlisten-${i}`])
      }
      await q(n, 'select pg_notify($1, $2)', [OTHER, 'marker'])
    } finally {
      await closeClient(n)
    }
    await waitFor(10000, () => gotOther.length > otherBefore, `marker notification on ${OTHER}`)
    await q(listener, 'select 1') // the listener reads from its socket once more
    await sleep(500)
    assert.equal(
      got.length,
      countBefore,
      `notifications after UNLISTEN: ${got.slice(countBefore).map((m) => m.payload)}`,
    )
    assert.equal(gotOther[gotOther.length - 1].payload, 'marker')
  } finally {
    await closeClient(listener)
    await closeClient(other)
  }
})

test('LISTEN from several clients on one channel: each gets every notification once', { timeout: 30000 }, async () => {
  const LISTENERS = 6
  const clients = []
  try {
    for (let l = 0; l < LISTENERS; l++) {
      const c = await connect()
      const got = collect(c)
      await q(c, `listen ${CHAN}`)
      clients.push({ c, got })
    }
    const n = await connect()
    const expected = []
    try {
      for (let i = 0; i < 20; i++) {
        await q(n, 'begin')
        await q(n, 'select pg_notify($1, $2)', [CHAN, `fanout-${i}`])
        await q(n, 'commit')
        expected.push(`fanout-${i}`)
      }
    } finally {
      await closeClient(n)
    }
    await waitFor(10000, () => clients.every(({ got }) => got.length >= expected.length), 'every listener').catch(
      () => {},
    )
    for (const { c } of clients) await q(c, 'select 1')
    await sleep(300)
    for (const [l, { got }] of clients.entries()) {
      assertExactlyOnce(
        got.map((m) => m.payload),
        expected,
        `listener ${l}`,
      )
      // Notifications from one session arrive in commit order.
      assert.deepEqual(
        got.map((m) => m.payload),
        expected,
        `listener ${l}: order`,
      )
    }
  } finally {
    for (const { c } of clients) await closeClient(c)
  }
})

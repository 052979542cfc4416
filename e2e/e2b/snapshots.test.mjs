// The official `e2b` SDK's snapshot calls against a real torpor daemon:
// snapshots are torpor's checkpoints (docs/fork.md, docs/e2b.md).
// e2e/fork_e2b_test.go starts the daemon and runs this file (files go
// through envd: the base template has no bash for commands.run).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const T = { timeout: 180_000 }
const made = []
after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})
const template = process.env.TORPOR_E2B_TEMPLATE || 'base'

test('createSnapshot, listSnapshots, create from a snapshot, deleteSnapshot', T, async () => {
  const sbx = await Sandbox.create(template, { timeoutMs: 300_000 })
  made.push(sbx)
  await sbx.files.write('/root/a.txt', 'one\n')
  const snap = await sbx.createSnapshot({ name: 'sdk-snap' })
  assert.ok(snap.snapshotId.includes(sbx.sandboxId), snap.snapshotId)
  assert.deepEqual(snap.names, ['sdk-snap'])
  await sbx.files.write('/root/b.txt', 'two\n')

  const listed = []
  for (const p = sbx.listSnapshots(); p.hasNext;) listed.push(...(await p.nextItems()))
  assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId])

  const kid = await Sandbox.create(snap.snapshotId, { timeoutMs: 300_000, metadata: { from: 'sdk' } })
  made.push(kid)
  assert.equal(await kid.files.read('/root/a.txt'), 'one\n')
  assert.equal(await kid.files.exists('/root/b.txt'), false)
  const info = await kid.getInfo()
  assert.equal(info.metadata.forked_from, sbx.sandboxId)
  assert.equal(info.metadata.forked_from_checkpoint, 'sdk-snap')
  assert.equal(info.metadata.from, 'sdk')

  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
})

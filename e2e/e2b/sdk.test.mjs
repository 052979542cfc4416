// The official `e2b` SDK against a real torpor daemon, unchanged: only
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point it at torpor
// (e2e/e2b_test.go starts the daemon and runs this file).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import { Sandbox, CommandExitError, NotFoundError, FilesystemEventType, Secret, SecretError, SecretNotFoundError, Volume, VolumePathNotFoundError } from 'e2b'

const T = { timeout: 180_000 }
const made = []
async function create(opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, ...opts })
  made.push(sbx)
  return sbx
}
after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
async function waitState(id, want, ms = 30_000) {
  const end = Date.now() + ms
  for (;;) {
    const info = await Sandbox.getInfo(id)
    if (info.state === want) return info
    if (Date.now() > end) assert.fail(`sandbox ${id} is ${info.state}, not ${want}, after ${ms} ms`)
    await sleep(200)
  }
}

test('create with metadata and envs, getInfo, list with filters', T, async () => {
  const tag = `t${Date.now()}`
  const sbx = await create({ metadata: { suite: tag, kind: 'a b/c' }, envs: { GREETING: 'hello' } })
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { suite: tag, kind: 'a b/c' })
  assert.ok(info.endAt > info.startedAt)
  const other = await create({ metadata: { suite: tag, kind: 'other' } })

  const byKind = await Sandbox.list({ query: { metadata: { suite: tag, kind: 'a b/c' } } }).nextItems()
  assert.deepEqual(byKind.map((s) => s.sandboxId), [sbx.sandboxId])
  const all = []
  const pages = Sandbox.list({ query: { metadata: { suite: tag } }, limit: 1 })
  while (pages.hasNext) all.push(...(await pages.nextItems()))
  assert.deepEqual(all.map((s) => s.sandboxId).sort(), [sbx.sandboxId, other.sandboxId].sort())
  await other.pause()
  const running = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['running'] } }).nextItems()
  assert.deepEqual(running.map((s) => s.sandboxId), [sbx.sandboxId])
  const paused = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['paused'] } }).nextItems()
  assert.deepEqual(paused.map((s) => s.sandboxId), [other.sandboxId])

  const r = await sbx.commands.run('echo $GREETING')
  assert.equal(r.stdout, 'hello\n')
  const metrics = await sbx.getMetrics()
  assert.ok(Array.isArray(metrics))
})

test('commands: exit codes, stderr, envs, cwd, user', T, async () => {
  const sbx = await create()
  const ok = await sbx.commands.run('echo out; echo err >&2')
  assert.equal(ok.exitCode, 0)
  assert.equal(ok.stdout, 'out\n')
  assert.equal(ok.stderr, 'err\n')
  await assert.rejects(sbx.commands.run('echo bad >&2; exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError, String(e))
    assert.equal(e.exitCode, 3)
    assert.equal(e.stderr, 'bad\n')
    return true
  })
  assert.equal((await sbx.commands.run('echo $A-$B', { envs: { A: '1', B: 'two' } })).stdout, '1-two\n')
  assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
  assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  const seen = []
  await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => seen.push(d) })
  assert.equal(seen.join(''), '1\n2\n3\n')
  // bash -l, curl, git and python3 are in the base template.
  assert.match((await sbx.commands.run('curl --version && git --version && python3 -c "print(6*7)"')).stdout, /42/)
})

test('commands: background, list, kill, stdin, connect', T, async () => {
  const sbx = await create()
  const h = await sbx.commands.run('sleep 600', { background: true })
  assert.ok(h.pid > 0)
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === h.pid), JSON.stringify(listed))
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(h.wait(), CommandExitError)
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === h.pid))
  assert.equal(await sbx.commands.kill(h.pid), false)

  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'through stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  const res = await cat.wait()
  assert.equal(res.stdout, 'through stdin\n')

  const ticker = await sbx.commands.run('for i in $(seq 1 50); do echo tick$i; sleep 0.1; done', { background: true })
  await sleep(500)
  await ticker.disconnect()
  const again = await sbx.commands.connect(ticker.pid)
  const end = await again.wait()
  assert.equal(end.exitCode, 0)
  assert.match(end.stdout, /tick50/)
})

test('files: text, binary, multi-file write, list, mkdir, rename, remove, exists, watch', T, async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/hello.txt', 'hello world')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello world')
  assert.equal(await sbx.files.read('hello.txt'), 'hello world') // relative to the user's home
  const bin = new Uint8Array(256 * 1024).map((_, i) => (i * 7) & 255)
  await sbx.files.write('/home/user/bin.dat', bin.buffer)
  const back = await sbx.files.read('/home/user/bin.dat', { format: 'bytes' })
  assert.deepEqual(Buffer.from(back), Buffer.from(bin))
  // Files written through the SDK belong to the user: commands can change them.
  await sbx.commands.run('echo more >> /home/user/hello.txt')

  const infos = await sbx.files.write([
    { path: '/home/user/multi/a.txt', data: 'A' },
    { path: '/home/user/multi/b.txt', data: 'B' },
  ])
  assert.equal(infos.length, 2)
  const names = (await sbx.files.list('/home/user/multi')).map((e) => e.name).sort()
  assert.deepEqual(names, ['a.txt', 'b.txt'])

  assert.equal(await sbx.files.makeDir('/home/user/d'), true)
  assert.equal(await sbx.files.makeDir('/home/user/d'), false)
  await sbx.files.rename('/home/user/multi/a.txt', '/home/user/d/a2.txt')
  assert.equal(await sbx.files.exists('/home/user/d/a2.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/multi/a.txt'), false)
  await sbx.files.remove('/home/user/d')
  assert.equal(await sbx.files.exists('/home/user/d'), false)
  await assert.rejects(sbx.files.read('/home/user/nope.txt'), NotFoundError)

  const events = []
  const w = await sbx.files.watchDir('/home/user', (e) => events.push(e))
  await sbx.commands.run('echo x > /home/user/watched.txt')
  const end = Date.now() + 10_000
  while (!events.some((e) => e.name === 'watched.txt' && (e.type === FilesystemEventType.CREATE || e.type === FilesystemEventType.WRITE))) {
    if (Date.now() > end) assert.fail(`no event for watched.txt: ${JSON.stringify(events)}`)
    await sleep(100)
  }
  await w.stop()

  // Paths never leave the sandbox: '..' and symlinks resolve inside it
  // (this test runs on the daemon's host).
  const mark = `escape-${process.pid}-${Date.now()}`
  await sbx.files.write(`/../../../../tmp/${mark}-a`, 'x').catch(() => {})
  await sbx.commands.run('ln -s / /home/user/up')
  await sbx.files.write(`/home/user/up/tmp/${mark}-b`, 'x').catch(() => {})
  assert.equal(existsSync(`/tmp/${mark}-a`), false)
  assert.equal(existsSync(`/tmp/${mark}-b`), false)
  assert.equal((await sbx.commands.run(`cat /tmp/${mark}-a /tmp/${mark}-b`)).stdout, 'xx')
})

test('setTimeout moves the end; kill; a missing sandbox', T, async () => {
  const sbx = await create({ timeoutMs: 60_000 })
  const before = (await sbx.getInfo()).endAt
  await sbx.setTimeout(600_000)
  const after = (await sbx.getInfo()).endAt
  assert.ok(after.getTime() - before.getTime() > 400_000, `${before} -> ${after}`)
  assert.equal(await sbx.kill(), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
  assert.equal(await sbx.isRunning(), false)
})

test('pause, then connect: files, /dev/shm, background processes and memory kept', T, async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/kept.txt', 'on disk')
  await sbx.commands.run('echo in-memory > /dev/shm/m')
  const counter = await sbx.commands.run('i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done', { background: true })
  await sbx.commands.run('python3 -c "import time; time.sleep(0.1)"')
  await sleep(500)
  const n1 = Number((await sbx.commands.run('cat /tmp/count')).stdout)
  assert.equal(await sbx.pause(), true)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  assert.equal(await Sandbox.pause(sbx.sandboxId), false) // already paused
  // Without autoResume, envd is not reached while paused (the SDK says
  // the sandbox is not running).
  await assert.rejects(sbx.commands.run('true'), /not running/)
  await sleep(1500)
  const same = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await same.getInfo()).state, 'running')
  assert.equal(await same.files.read('/home/user/kept.txt'), 'on disk')
  assert.equal((await same.commands.run('cat /dev/shm/m')).stdout, 'in-memory\n')
  assert.ok((await same.commands.list()).some((p) => p.pid === counter.pid), 'the counter survived the pause')
  const n2 = Number((await same.commands.run('cat /tmp/count')).stdout)
  assert.ok(n2 >= n1 && n2 < n1 + 10, `counted ${n1} before the pause and ${n2} after: it ran while paused`)
})

test('auto-pause at the timeout, auto-resume on the next call', T, async () => {
  const sbx = await create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  await sbx.commands.run('echo before > /dev/shm/state')
  await waitState(sbx.sandboxId, 'paused', 30_000)
  assert.equal((await sbx.commands.run('cat /dev/shm/state')).stdout, 'before\n')
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
})

test('the timeout kills a sandbox created without auto-pause', T, async () => {
  const sbx = await Sandbox.create({ timeoutMs: 2_000 })
  const end = Date.now() + 30_000
  for (;;) {
    const gone = await Sandbox.getInfo(sbx.sandboxId).then(() => false, (e) => e instanceof NotFoundError)
    if (gone) break
    if (Date.now() > end) assert.fail('still there 30 s after a 2 s timeout')
    await sleep(250)
  }
})

test('the same sandbox through torpor\'s native CLI at the same time', T, async () => {
  const cli = (...args) => execFileSync(process.env.TORPOR_BIN, args, { encoding: 'utf8' })
  const sbx = await create({ metadata: { via: 'e2b' } })
  await sbx.files.write('/home/user/shared.txt', 'from the SDK')
  assert.equal(cli('exec', sbx.sandboxId, '--', 'cat', '/home/user/shared.txt'), 'from the SDK')
  const native = JSON.parse(cli('get', sbx.sandboxId, '--json'))
  assert.equal(native.metadata.via, 'e2b')
  assert.equal(native.state, 'running')
  cli('pause', sbx.sandboxId)
  assert.equal((await sbx.getInfo()).state, 'paused')
  cli('start', sbx.sandboxId)
  assert.equal((await sbx.commands.run('cat shared.txt')).stdout, 'from the SDK')
  cli('rm', sbx.sandboxId)
  assert.equal(await sbx.isRunning(), false)
})

test('secrets: the Secret class on torpor\'s tenant secrets; one reaches a native sandbox; another tenant sees none', T, async () => {
  const cli = (args, input) => execFileSync(process.env.TORPOR_BIN, args, { encoding: 'utf8', input, stdio: 'pipe' })
  const n = Date.now()
  const name = `sdk-token-${n}`
  const v1 = `e2b-sdk-secret-one-${n}`
  const v2 = `e2b-sdk-secret-two-${n}`
  const answers = []
  const keep = (x) => { answers.push(JSON.stringify(x)); return x }

  // Created with capitals, kept lower-cased as E2B does; version 1.
  const made = keep(await Secret.create(`SDK-Token-${n}`, v1))
  assert.equal(made.name, name)
  assert.equal(made.version, 1)
  assert.match(made.secretId, /^sec_[0-9a-f]{24}$/)
  assert.deepEqual(made.metadata, {})
  assert.ok(made.createdAt instanceof Date && !isNaN(made.createdAt))
  await assert.rejects(Secret.create(name, 'again'), SecretError)

  // getInfo and exists, by identifier and by name; update rotates.
  assert.equal(keep(await Secret.getInfo(made.secretId)).name, name)
  assert.equal(keep(await Secret.getInfo(name)).secretId, made.secretId)
  assert.equal(await Secret.exists(name), true)
  assert.equal(await Secret.exists(`no-such-${n}`), false)
  await assert.rejects(Secret.getInfo(`no-such-${n}`), SecretNotFoundError)
  const up = keep(await Secret.update(made.secretId, v2))
  assert.equal(up.version, 2)
  assert.equal(up.secretId, made.secretId)

  // The native CLI sees the same secret, and a sandbox made natively
  // gets its current value.
  const native = JSON.parse(cli(['secrets', 'get', name, '--json']))
  assert.equal(native.version, 2)
  const id = cli(['create', '--secret', `${name}=env:SDK_TOKEN`]).trim()
  try {
    assert.equal(cli(['exec', id, '--', 'sh', '-c', 'printf %s "$SDK_TOKEN"']), v2)
  } finally {
    cli(['rm', id])
  }
  // And one set with the CLI is the SDK's to read.
  cli(['secrets', 'set', `cli-made-${n}`], `cli-value-${n}\n`)
  assert.equal(keep(await Secret.getInfo(`cli-made-${n}`)).version, 1)

  // Listed, page by page.
  const listed = []
  const pages = Secret.list({ limit: 1 })
  while (pages.hasNext) listed.push(...keep(await pages.nextItems()))
  assert.ok(listed.some((s) => s.secretId === made.secretId && s.version === 2))
  assert.ok(listed.some((s) => s.name === `cli-made-${n}`))

  // Another tenant's key sees none of it.
  const otherKey = cli(['keys', 'create', '--tenant', `sdk-other-${n}`]).trim()
  const other = { apiKey: otherKey }
  const theirs = []
  const otherPages = Secret.list({ ...other })
  while (otherPages.hasNext) theirs.push(...(await otherPages.nextItems()))
  assert.deepEqual(theirs, [])
  assert.equal(await Secret.exists(made.secretId, other), false)
  assert.equal(await Secret.exists(name, other), false)
  await assert.rejects(Secret.update(made.secretId, 'stolen', other), SecretNotFoundError)
  assert.equal(await Secret.destroy(name, other), false)
  assert.equal((await Secret.getInfo(name)).version, 2)

  // destroy: true, then false; gone for the CLI too.
  assert.equal(await Secret.destroy(made.secretId), true)
  assert.equal(await Secret.destroy(made.secretId), false)
  assert.equal(await Secret.exists(name), false)
  assert.equal(await Secret.destroy(`cli-made-${n}`), true)
  assert.throws(() => cli(['secrets', 'get', name], undefined))

  for (const a of answers) {
    for (const v of [v1, v2, `cli-value-${n}`]) assert.ok(!a.includes(v), `an answer holds a value: ${a}`)
  }
})

test('volumeMounts: a native volume mounted through the SDK in two sandboxes; its files outlive them', T, async () => {
  const cli = (...args) => execFileSync(process.env.TORPOR_BIN, args, { encoding: 'utf8' })
  cli('volumes', 'create', 'sdk-data', '32')
  const sbx = await create({ volumeMounts: { '/mnt/data': 'sdk-data' } })
  await sbx.commands.run('echo from-sdk > /mnt/data/out.txt')
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.deepEqual(info.volumeMounts, [{ name: 'sdk-data', path: '/mnt/data' }])
  const other = await create({ volumeMounts: { '/in': 'sdk-data' } })
  assert.equal((await other.commands.run('cat /in/out.txt')).stdout, 'from-sdk\n')
  await assert.rejects(create({ volumeMounts: { '/x': 'no-such-volume' } }))
  assert.throws(() => cli('volumes', 'rm', 'sdk-data'))
  await sbx.kill()
  await other.kill()
  const kept = await create({ volumeMounts: { '/again': 'sdk-data' } })
  assert.equal((await kept.commands.run('cat /again/out.txt')).stdout, 'from-sdk\n')
  await kept.kill()
  cli('volumes', 'rm', 'sdk-data')
})

test('volumes: the Volume class on torpor\'s tenant volumes, its files by token, mounted by a sandbox', T, async () => {
  // The SDK sends a volume's file calls to E2B_VOLUME_API_URL: torpor's
  // API, as E2B_API_URL (docs/e2b.md).
  process.env.E2B_VOLUME_API_URL ||= process.env.E2B_API_URL
  const cli = (args) => execFileSync(process.env.TORPOR_BIN, args, { encoding: 'utf8', stdio: 'pipe' })
  const name = `sdk-vol-${Date.now()}`
  const vol = await Volume.create(name)
  assert.match(vol.volumeId, /^vol_/)
  assert.equal(vol.name, name)
  assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId && v.name === name))
  assert.equal((await Volume.getInfo(vol.volumeId)).name, name)

  const w = await vol.writeFile('/in/seed.txt', 'seeded by the SDK', { mode: 0o600 })
  assert.equal(w.type, 'file')
  assert.equal(w.size, 17)
  assert.equal(w.mode, 0o600)
  const again = await Volume.connect(vol.volumeId)
  assert.equal(await again.readFile('/in/seed.txt'), 'seeded by the SDK')
  // Writable by the sandbox's user.
  const dir = await vol.makeDir('/out', { mode: 0o777 })
  assert.equal(dir.type, 'directory')
  assert.equal(dir.mode, 0o777)
  assert.deepEqual((await vol.list('/')).map((e) => e.name).sort(), ['in', 'out'])
  assert.equal(await vol.exists('/in/seed.txt'), true)
  assert.equal(await vol.exists('/nope'), false)
  await assert.rejects(vol.readFile('/nope'), VolumePathNotFoundError)
  // Readable by the sandbox's user (E2B's commands run as "user").
  assert.equal((await vol.updateMetadata('/in/seed.txt', { mode: 0o644 })).mode, 0o644)

  // The native CLI sees it; a sandbox mounts it and writes a result.
  assert.equal(JSON.parse(cli(['volumes', 'get', name, '--json'])).id, vol.volumeId)
  const sbx = await create({ volumeMounts: { '/mnt/data': name } })
  assert.equal((await sbx.commands.run('cat /mnt/data/in/seed.txt && echo done > /mnt/data/out/r.txt')).stdout, 'seeded by the SDK')
  assert.equal(await vol.readFile('/out/r.txt'), 'done\n')
  await assert.rejects(Volume.destroy(vol.volumeId))
  await sbx.kill()

  await vol.remove('/out')
  assert.equal(await vol.exists('/out'), false)
  assert.equal(await Volume.destroy(vol.volumeId), true)
  assert.equal(await Volume.destroy(vol.volumeId), false)
})

// The E2B SDK's hot paths against torpor's native API, from the same
// node process, one SDK sample then one native sample (node's own fetch)
// in turn, so both pay the same client runtime. BenchmarkE2B
// (e2e/e2b_bench_test.go) runs it. Prints {"sdk": [ms...], "native": [ms...]}.
//   node bench.mjs OP N SANDBOX_ID
// Needs E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, as torpor serve prints them.
import { Sandbox } from 'e2b'

const [op, nArg, id] = process.argv.slice(2)
const n = Number(nArg)
const api = process.env.E2B_API_URL
const native = (method, path, body, json = true) =>
  fetch(api + '/v1/sandboxes' + path, {
    method,
    headers: { Authorization: 'Bearer ' + process.env.E2B_API_KEY, ...(json && body ? { 'Content-Type': 'application/json' } : {}) },
    body: json && body ? JSON.stringify(body) : body,
  }).then(async (r) => {
    const b = await r.arrayBuffer()
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${Buffer.from(b)}`)
    return b
  })
const e2b = (path, body) =>
  fetch(api + path, { method: 'POST', headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) })
    .then((r) => r.arrayBuffer())
const tenMiB = Buffer.alloc(10 << 20, 7)
const time = async (fn) => {
  const t0 = performance.now()
  await fn()
  return performance.now() - t0
}

const sbx = await Sandbox.connect(id)
const pairs = {
  // commands.run('true') vs a native exec of true.
  'run-true': [() => sbx.commands.run('true'), () => native('POST', `/${id}/exec`, { cmd: ['true'] })],
  // Sandbox.create + the first command vs a native create + exec.
  'create-first': [
    async () => {
      const s = await Sandbox.create({ timeoutMs: 120_000 })
      await s.commands.run('true')
      return s.kill()
    },
    async () => {
      const sb = JSON.parse(Buffer.from(await native('POST', '', { template: 'e2b-base' })))
      await native('POST', `/${sb.id}/exec`, { cmd: ['true'] })
      return native('DELETE', `/${sb.id}`)
    },
  ],
  // files.write of a 10 MiB Buffer (the SDK sends multipart) and of a
  // stream (octet-stream) vs a native PUT.
  write: [() => sbx.files.write('/home/user/ten.bin', tenMiB), () => native('PUT', `/${id}/files?path=/home/user/ten.bin`, tenMiB, false)],
  'write-stream': [
    () => sbx.files.write('/home/user/ten.bin', new Blob([tenMiB]).stream()),
    () => native('PUT', `/${id}/files?path=/home/user/ten.bin`, tenMiB, false),
  ],
  read: [() => sbx.files.read('/home/user/ten.bin', { format: 'bytes' }), () => native('GET', `/${id}/files?path=/home/user/ten.bin`)],
  // Sandbox.pause + Sandbox.connect vs the native verbs; and the same
  // E2B calls made with plain fetch, which is torpor's share of it.
  'pause-connect': [
    async () => {
      await Sandbox.pause(id)
      await Sandbox.connect(id)
    },
    async () => {
      await native('POST', `/${id}/pause`)
      await native('POST', `/${id}/connect`)
    },
  ],
  'rest-pause-connect': [
    async () => {
      await e2b(`/sandboxes/${id}/pause`)
      await e2b(`/v2/sandboxes/${id}/connect`, { timeout: 300 })
    },
    async () => {
      await native('POST', `/${id}/pause`)
      await native('POST', `/${id}/connect`)
    },
  ],
}
const [a, b] = pairs[op] ?? []
if (!a) throw new Error(`unknown op ${op}`)
if (op === 'read') await sbx.files.write('/home/user/ten.bin', tenMiB)
await a()
await b()
const out = { sdk: [], native: [] }
for (let i = 0; i < n; i++) {
  out.sdk.push(await time(a))
  out.native.push(await time(b))
}
console.log(JSON.stringify(out))

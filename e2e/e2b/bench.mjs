// Timings of the E2B SDK's hot paths against a torpor daemon, for
// BenchmarkE2B (e2e/e2b_bench_test.go), which runs the native
// equivalents in the same rounds. Prints one JSON object of milliseconds
// per sample: {"op": [...]}.
//   node bench.mjs OP N [SANDBOX_ID]
import { Sandbox } from 'e2b'

const [op, nArg, id] = process.argv.slice(2)
const n = Number(nArg)
const out = []
const time = async (fn) => {
  const t0 = performance.now()
  await fn()
  out.push(performance.now() - t0)
}
const tenMiB = Buffer.alloc(10 << 20, 7)

switch (op) {
  case 'run-true': {
    const sbx = await Sandbox.connect(id)
    await sbx.commands.run('true')
    for (let i = 0; i < n; i++) await time(() => sbx.commands.run('true'))
    break
  }
  case 'create-first': {
    for (let i = 0; i < n; i++) {
      let sbx
      await time(async () => {
        sbx = await Sandbox.create({ timeoutMs: 120_000 })
        await sbx.commands.run('true')
      })
      await sbx.kill()
    }
    break
  }
  case 'write': {
    const sbx = await Sandbox.connect(id)
    for (let i = 0; i < n; i++) await time(() => sbx.files.write('/home/user/ten.bin', tenMiB))
    break
  }
  case 'read': {
    const sbx = await Sandbox.connect(id)
    await sbx.files.write('/home/user/ten.bin', tenMiB)
    for (let i = 0; i < n; i++) await time(() => sbx.files.read('/home/user/ten.bin', { format: 'bytes' }))
    break
  }
  case 'pause-connect': {
    for (let i = 0; i < n; i++) {
      await time(async () => {
        await Sandbox.pause(id)
        await Sandbox.connect(id)
      })
    }
    break
  }
  default:
    throw new Error(`unknown op ${op}`)
}
console.log(JSON.stringify({ [op]: out }))

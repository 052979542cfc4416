// The official `@e2b/code-interpreter` SDK against a real torpor daemon.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const T = { timeout: 300_000 }
const made = []
after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

test('runCode: results, output, errors, state kept across a pause', T, async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  made.push(sbx)
  let exec = await sbx.runCode('x = 41\nprint("hi")\nx + 1')
  assert.equal(exec.error, undefined)
  assert.deepEqual(exec.logs.stdout, ['hi\n'])
  assert.equal(exec.text, '42')

  const out = []
  exec = await sbx.runCode('import sys\nprint("to err", file=sys.stderr)', { onStderr: (m) => out.push(m.line) })
  assert.deepEqual(exec.logs.stderr, ['to err\n'])
  assert.deepEqual(out, ['to err\n'])

  // Output streams while the cell runs.
  const seen = []
  const t0 = Date.now()
  exec = await sbx.runCode('import time\nprint("early")\ntime.sleep(2)\nprint("late")', { onStdout: (m) => seen.push([m.line, Date.now() - t0]) })
  const took = Date.now() - t0
  assert.deepEqual(exec.logs.stdout.join(''), 'early\nlate\n')
  assert.equal(seen.map(([l]) => l).join(''), 'early\nlate\n')
  assert.ok(took - seen[0][1] > 1000, `the first line came ${seen[0][1]} ms in, the cell took ${took} ms`)

  exec = await sbx.runCode('1/0')
  assert.equal(exec.error.name, 'ZeroDivisionError')
  assert.match(exec.error.traceback, /ZeroDivisionError/)

  // A PNG made without any library: an object that shows itself as one.
  exec = await sbx.runCode(`
import struct, zlib
def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
class Dot:
    def _repr_png_(self):
        raw = b'\\x00\\xff\\x00\\x00'
        return b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')
Dot()`)
  assert.equal(exec.error, undefined)
  const png = Buffer.from(exec.results[0].png, 'base64')
  assert.equal(png.subarray(1, 4).toString(), 'PNG')

  await sbx.pause()
  const again = await Sandbox.connect(sbx.sandboxId)
  exec = await again.runCode('x')
  assert.equal(exec.text, '41')

  const ctx = await again.createCodeContext()
  exec = await again.runCode('y = 1', { context: ctx })
  exec = await again.runCode("'y' in globals()")
  assert.equal(exec.text, 'False')
  exec = await again.runCode("y + 1", { context: ctx })
  assert.equal(exec.text, '2')
})

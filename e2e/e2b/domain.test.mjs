// E2B's E2B_DOMAIN form: the SDK reaches envd at
// https://49983-<id>.<domain> (TLS with the certificate torpor serve was
// given), the same sandbox through the same proxy.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

test('commands and files over https://<port>-<id>.<domain>', { timeout: 120_000 }, async () => {
  assert.ok(process.env.E2B_DOMAIN && !process.env.E2B_SANDBOX_URL)
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  try {
    assert.equal((await sbx.commands.run('echo over tls')).stdout, 'over tls\n')
    await sbx.files.write('/home/user/t.txt', 'tls file')
    assert.equal(await sbx.files.read('/home/user/t.txt'), 'tls file')
    assert.equal(await sbx.pause(), true)
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.commands.run('cat /home/user/t.txt')).stdout, 'tls file')
  } finally {
    await sbx.kill()
  }
})

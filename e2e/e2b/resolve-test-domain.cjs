// Test only: resolves every name under .e2b.test to loopback in this node
// process, as a wildcard DNS record would (e2e/e2b_test.go preloads it).
const dns = require('node:dns')
const lookup = dns.lookup
dns.lookup = function (host, opts, cb) {
  if (typeof opts === 'function') [cb, opts] = [opts, {}]
  if (typeof host === 'string' && host.endsWith('.e2b.test')) {
    if (opts && opts.all) return process.nextTick(cb, null, [{ address: '127.0.0.1', family: 4 }])
    return process.nextTick(cb, null, '127.0.0.1', 4)
  }
  return lookup.call(this, host, opts, cb)
}

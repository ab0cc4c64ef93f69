// A rate-limited API for bench/ratelimit.lua, limited by a real third-party
// limiter with its memory store (a fixed window of LIMIT requests per
// WINDOW_MS, opened by the first request after the last one ended):
//
//   node server.js PORT KIND LIMIT WINDOW_MS
//
// KIND: express-legacy      express-rate-limit, X-RateLimit-* (reset: epoch seconds)
//       express-draft-7     express-rate-limit, RateLimit and RateLimit-Policy
//       fastify             @fastify/rate-limit, x-ratelimit-* (reset: seconds until it)
//       fastify-no-retry    the same without Retry-After (addHeaders)
// GET /api is limited; GET /_stop answers "<accepted> <limited>" and stops
// counting. Prints "listening PORT" once it is.
'use strict'

const [port, kind, limit, windowMs] = [Number(process.argv[2]), process.argv[3],
  Number(process.argv[4]), Number(process.argv[5])]
let ok = 0
let limited = 0
let counting = true
const stop = () => { counting = false; return `${ok} ${limited}` }
const listening = () => console.log(`listening ${port}`)

if (kind.startsWith('express')) {
  const express = require('express')
  const { rateLimit } = require('express-rate-limit')
  const app = express()
  app.get('/_stop', (req, res) => res.send(stop()))
  app.use('/api', rateLimit({
    windowMs,
    limit,
    legacyHeaders: kind === 'express-legacy',
    standardHeaders: kind === 'express-draft-7' ? 'draft-7' : false,
    handler: (req, res, next, options) => {
      if (counting) limited++
      res.status(options.statusCode).send(options.message)
    }
  }))
  app.get('/api', (req, res) => { if (counting) ok++; res.send('ok') })
  app.listen(port, '127.0.0.1', listening)
} else if (kind.startsWith('fastify')) {
  const fastify = require('fastify')()
  fastify.register(require('@fastify/rate-limit'), {
    max: limit,
    timeWindow: windowMs,
    global: false,
    addHeaders: kind === 'fastify-no-retry' ? { 'retry-after': false } : {},
    onExceeded: () => { if (counting) limited++ }
  })
  fastify.register(async (app) => {
    app.get('/_stop', async () => stop())
    app.get('/api', { config: { rateLimit: { max: limit, timeWindow: windowMs } } }, async () => {
      if (counting) ok++
      return 'ok'
    })
  })
  fastify.listen({ port, host: '127.0.0.1' }).then(listening)
} else {
  console.error(`unknown kind ${kind}`)
  process.exit(2)
}

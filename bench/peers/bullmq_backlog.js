// Peer benchmark: a large BullMQ delayed backlog on a local Redis: what
// `hourglass bench backlog-scale` measures of Hourglass's waiting tasks.
//
// usage: node bullmq_backlog.js PORT N PAYLOAD_BYTES
// Adds N delayed no-op jobs (addBulk, 1000 a call) due evenly over a day
// starting an hour from now, with no data and then, in a second queue,
// with PAYLOAD_BYTES of data each; prints one JSON line: seconds to load,
// Redis bytes per job (used_memory before and after), for both.
// Needs `npm install bullmq@5` (see shared/peers/README.md).
const { Queue } = require('bullmq');
const IORedis = require('ioredis');
const port = +process.argv[2], N = +process.argv[3], payloadBytes = +process.argv[4];
const connection = { host: '127.0.0.1', port };

async function usedMemory(r) {
  for (;;) {
    const info = await r.info('memory');
    const field = (name) => +(info.match(new RegExp(`^${name}:(\\d+)`, 'm')) || [0, -1])[1];
    if (field('lazyfree_pending_objects') <= 0) return field('used_memory');
    await new Promise((ok) => setTimeout(ok, 20));
  }
}

async function load(r, name, data) {
  const q = new Queue(name, { connection });
  const before = await usedMemory(r);
  const started = Date.now();
  const start = Date.now() + 3600 * 1000, step = (24 * 3600 * 1000) / N;
  for (let off = 0; off < N; off += 1000) {
    const batch = [];
    for (let i = off; i < Math.min(N, off + 1000); i++) {
      const delay = Math.floor(start + i * step) - Date.now();
      batch.push({ name: 'j', data, opts: { delay, removeOnComplete: true, removeOnFail: true } });
    }
    await q.addBulk(batch);
  }
  const seconds = (Date.now() - started) / 1000;
  const bytes = ((await usedMemory(r)) - before) / N;
  await q.close();
  return { seconds, bytes: Math.round(bytes) };
}

(async () => {
  const r = new IORedis(connection);
  await r.flushall();
  const bare = await load(r, 'backlog', {});
  const withPayload = await load(r, 'backlog-payload', { p: 'x'.repeat(Math.max(0, payloadBytes - 8)) });
  console.log(JSON.stringify({
    system: 'bullmq', n: N, load_seconds: bare.seconds, load_jobs_per_s: Math.round(N / bare.seconds),
    redis_bytes_per_job: bare.bytes, payload_bytes: payloadBytes, redis_bytes_per_job_with_payload: withPayload.bytes,
  }));
  await r.quit();
  process.exit(0);
})();

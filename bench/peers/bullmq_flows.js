// Peer benchmark: BullMQ flows (a parent job waiting for its children) beside
// plain BullMQ delayed jobs, on a local Redis: what `hourglass bench groups`
// measures for Hourglass's workflow groups.
//
// usage: node bullmq_flows.js PORT N GROUP_SIZE CONCURRENCY
// 1. plain: N no-op jobs delayed to one instant T0; children/s from T0 to the last done.
// 2. flows: N/GROUP_SIZE flows, each a parent (queue "done") with GROUP_SIZE no-op
//    children (queue "kids") delayed to one instant; Redis bytes per waiting child
//    (used_memory before and after adding them), children/s from T0 to the last
//    child done, and when the last parent completed (its own worker, no-op).
// Prints one JSON line. Needs `npm install bullmq@5` (see shared/peers/README.md).
const { Queue, Worker, FlowProducer } = require('bullmq');
const IORedis = require('ioredis');
const port = +process.argv[2], N = +process.argv[3], size = +process.argv[4], conc = +process.argv[5];
const connection = { host: '127.0.0.1', port };

async function usedMemory(r) {
  for (;;) {
    const info = await r.info('memory');
    const field = (name) => +(info.match(new RegExp(`^${name}:(\\d+)`, 'm')) || [0, -1])[1];
    if (field('lazyfree_pending_objects') <= 0) return field('used_memory');
    await new Promise((ok) => setTimeout(ok, 20));
  }
}

function drain(queue, n, onDone) {
  return new Promise((resolve) => {
    let done = 0;
    const w = new Worker(queue, async () => {
      if (++done === n) { onDone(Date.now()); resolve(w); }
    }, { connection, concurrency: conc });
  });
}

(async () => {
  const r = new IORedis(connection);
  await r.flushall();

  // 1. Plain delayed jobs, all due at T0.
  const plain = new Queue('plain', { connection });
  let T0 = Date.now() + 2000 + Math.floor(N / 20);
  let before = await usedMemory(r);
  for (let off = 0; off < N; off += 1000) {
    const batch = [];
    for (let i = off; i < Math.min(N, off + 1000); i++) {
      batch.push({ name: 'j', data: {}, opts: { delay: T0 - Date.now(), removeOnComplete: true } });
    }
    await plain.addBulk(batch);
  }
  const plainBytes = ((await usedMemory(r)) - before) / N;
  let plainEnd = 0;
  const pw = await drain('plain', N, (t) => { plainEnd = t; });
  await pw.close();
  const plainRate = N / ((plainEnd - T0) / 1000);
  await r.flushall();

  // 2. Flows: parents in "done", children in "kids", the children due at T0.
  const flows = new FlowProducer({ connection });
  const groups = Math.ceil(N / size);
  before = await usedMemory(r);
  const addStart = Date.now();
  T0 = Date.now() + 2000 + Math.floor(N / 4);
  for (let g = 0; g < groups; g++) {
    const children = [];
    for (let i = g * size; i < Math.min(N, (g + 1) * size); i++) {
      children.push({ name: 'k', queueName: 'kids', data: {}, opts: { delay: Math.max(0, T0 - Date.now()), removeOnComplete: true } });
    }
    await flows.add({ name: 'p', queueName: 'done', data: { g }, children });
  }
  const addSeconds = (Date.now() - addStart) / 1000;
  const childBytes = ((await usedMemory(r)) - before) / N;
  if (Date.now() > T0) console.error('warning: adding the flows outlasted their lead; the drain started early');
  let kidsEnd = 0, parentsEnd = 0;
  const [kw, dw] = await Promise.all([
    drain('kids', N, (t) => { kidsEnd = t; }),
    drain('done', groups, (t) => { parentsEnd = t; }),
  ]);
  await Promise.all([kw.close(), dw.close()]);
  const flowRate = N / ((kidsEnd - T0) / 1000);
  console.log(JSON.stringify({
    system: 'bullmq', n: N, group_size: size, groups, concurrency: conc,
    plain_tasks_per_s: Math.round(plainRate), flow_children_per_s: Math.round(flowRate),
    ratio: +(flowRate / plainRate).toFixed(3),
    last_parent_after_last_child_ms: parentsEnd - kidsEnd,
    plain_redis_bytes_per_task: Math.round(plainBytes), flow_redis_bytes_per_child: Math.round(childBytes),
    add_children_per_s: Math.round(N / addSeconds),
  }));
  process.exit(0);
})();

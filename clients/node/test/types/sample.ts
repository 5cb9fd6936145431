// Every public call of the Node client, as an application would write it: `tsc --strict` must accept
// it (test/types.test.js), and must reject each `@ts-expect-error` line below.
import Redis from "ioredis";
import {
  Hourglass,
  HourglassError,
  GroupClosed,
  GraphRefused,
  NoEvents,
  WaitTimeout,
  UnknownTask,
  InvalidArgument,
  shardTags,
  shardOf,
  taskType,
  dueMs,
  nowMs,
  version,
} from "../..";
import type { Added, Cancelled, Declared, Ended, ErrorCode, Fired, GraphCancelled, GraphNode, GraphView, GroupView, NewTask, Outcome, Sealed, Stats, TaskView } from "../..";

export async function tour(redis: Redis): Promise<string[]> {
  const said: string[] = [`hourglass-client ${version}`];
  const hg = new Hourglass(redis, { prefix: "hourglass", shards: { "device.offline": 3 } });

  const first: boolean = await hg.schedule("order.timeout", "o-42", { delayMs: 15 * 60_000, payload: { order: 42 }, mode: "if-absent" });
  await hg.schedule("article.publish", Buffer.from("a-981"), {
    at: new Date("2026-12-01T07:00:00Z"),
    traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
  });
  await hg.schedule("device.offline", 7, { atMs: nowMs() + 30_000, mode: "only-later", payload: Buffer.from([0, 255]) });
  // @ts-expect-error: a number of ms is `atMs`; `at` takes a Date
  await hg.schedule("order.timeout", "o-1", { at: 5 });
  // @ts-expect-error: BullMQ's `delay` is `delayMs` here
  await hg.schedule("order.timeout", "o-1", { delay: 600_000 });
  // @ts-expect-error: no such mode
  await hg.schedule("order.timeout", "o-1", { mode: "sometimes" });
  said.push(`first: ${first}`);

  const tasks: NewTask[] = Array.from({ length: 3 }, (_, i) => ({ taskType: "mail", id: `m-${i}`, delayMs: i * 1000, payload: "hi" }));
  tasks.push({ taskType: "mail", id: Buffer.from("m-x"), at: new Date(), mode: "upsert" });
  const written: boolean[] = await hg.scheduleMany(tasks);
  // @ts-expect-error: no traceparent in bulk
  await hg.scheduleMany([{ taskType: "mail", id: "t", traceparent: "00-..." }]);
  said.push(`written: ${written.filter((w) => w).length}`);

  try {
    const ended: Ended = await hg.waitUntilFinished("mail", "m-0", { timeoutMs: 5_000 });
    const outcome: Outcome = ended.outcome;
    switch (outcome) {
      case "succeeded":
        said.push(`succeeded at attempt ${ended.attempt}, ${ended.finishedMs ?? "?"}`);
        break;
      case "dead":
        said.push(`dead: ${ended.error ?? ""}`);
        break;
      case "cancelled":
        said.push("cancelled");
        break;
      default: {
        const never: never = outcome;
        said.push(never);
      }
    }
  } catch (e) {
    if (e instanceof WaitTimeout || e instanceof NoEvents || e instanceof UnknownTask) said.push(e.code);
    else throw e;
  }
  try {
    await hg.scheduleMany([{ taskType: "mail", id: "" }]);
  } catch (e) {
    if (e instanceof InvalidArgument && e.cause instanceof HourglassError) said.push(`${e.code} ${e.cause.code}`);
  }
  // @ts-expect-error: the timeout is `timeoutMs`
  await hg.waitUntilFinished("mail", "m-0", { timeout: 5 });

  const moved: number | null = await hg.postpone("order.timeout", "o-42", 600_000);
  const now: number | null = await hg.runNow("order.timeout", "o-42");
  const view: TaskView = await hg.show("order.timeout", "o-42", { payloadBytes: 16 });
  if (view.state === "running" && view.running) said.push(`held by ${view.running.host} until ${view.running.untilMs}`);
  // @ts-expect-error: not a state
  if (view.state === "waiting") said.push("never");
  const cancelled: Cancelled = await hg.cancel("order.timeout", "o-42");
  said.push(`${moved} ${now} ${view.dueMs} ${cancelled.state} ${cancelled.groupTold}`);

  const ends: number | null = await hg.pause("order.timeout", { lengthMs: 300_000 });
  const resumed: boolean = await hg.resume("order.timeout");
  const stats: Stats = await hg.stats("order.timeout");
  said.push(`${ends} ${resumed} ${stats.dueNow} ${stats.pausedMs}`);

  const opened: boolean = await hg.groupOpen("order.ship", "o-17", { payload: { order: "o-17" }, when: "success", callbackId: "ship-o-17" });
  const added: Added = await hg.groupAdd("order.ship", "o-17", [
    { taskType: "order.reserve", id: "o-17" },
    { taskType: "order.charge", id: "o-17", payload: '{"amount":4200}', dueMs: nowMs() + 1000 },
  ]);
  const sealed: Sealed = await hg.groupSeal("order.ship", "o-17");
  if (sealed.state === "completed") {
    const fired: Fired = sealed.fired; // narrowed: never null here
    said.push(fired);
  }
  // @ts-expect-error: the seal is an object, not "completed:callback"
  const asText: string = await hg.groupSeal("order.ship", "o-17");
  const group: GroupView | null = await hg.groupShow("order.ship", "o-17");
  said.push(`${opened} ${added.joined} ${added.refused.length} ${sealed.state} ${group?.state} ${asText}`);
  try {
    await hg.groupAdd("order.ship", "o-17", [{ taskType: "order.mail", id: "late" }]);
  } catch (e) {
    if (e instanceof GroupClosed) {
      const code: "HG_GROUP_CLOSED" = e.code;
      said.push(code);
    } else if (e instanceof HourglassError) {
      const code: ErrorCode = e.code;
      said.push(code);
    } else throw e;
  }
  const nodes: GraphNode[] = [
    { name: "a", taskType: "step", payload: { n: 1 } },
    { name: "b", taskType: "step", id: "b-1", parents: ["a"], when: "success" },
  ];
  const declared: Declared = await hg.graphSubmit("flow", "g-1", nodes);
  const graph: GraphView | null = await hg.graphShow("flow", "g-1");
  const stopped: GraphCancelled | null = await hg.graphCancel("flow", "g-1");
  said.push(`${stopped?.skipped} ${stopped?.wasDone}`);
  said.push(`${declared.roots} ${graph?.nodes.map((n) => `${n.name}:${n.state}:${n.reason ?? ""}`).join(",")} ${graph?.counts.skipped}`);
  // @ts-expect-error: when is "all" or "success"
  const sometimes: GraphNode = { name: "c", taskType: "step", when: "sometimes" };
  said.push(sometimes.name);
  try {
    await hg.graphSubmit("flow", "g-1", nodes);
  } catch (e) {
    if (e instanceof GraphRefused) {
      const code: "HG_GRAPH_REFUSED" = e.code;
      said.push(code);
    } else throw e;
  }
  const bad = new InvalidArgument("x");
  // @ts-expect-error: an InvalidArgument's code is HG_INVALID_ARGUMENT
  const wrongCode: "HG_INVALID_ID" = bad.code;
  said.push(wrongCode);

  const tags: readonly string[] = shardTags("device.offline", 3);
  said.push(`${tags[shardOf("d-7", 3)]} ${taskType("order.timeout")} ${dueMs({ delayMs: 5 }, 0)} ${hg.shardFor("device.offline", "d-7")} ${hg.key("order.timeout", "due")}`);
  return said;
}

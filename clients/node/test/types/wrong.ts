// A program the typings must refuse: every line marked `wrong` is an error `tsc --strict` has to report
// (test/types.test.js checks each is reported, so a typing loosened to `any` fails the test).
import Redis from "ioredis";
import { Hourglass } from "../..";

export async function misuse(redis: Redis): Promise<void> {
  const hg = new Hourglass(redis, { prefix: 5 }); // wrong: a prefix is text
  await hg.schedule("t", "x", { at: 1_700_000_000_000 }); // wrong: `at` takes a Date; ms are `atMs`
  await hg.schedule("t", "x", { delay: 600_000 }); // wrong: BullMQ's delay is `delayMs`
  await hg.schedule("t", { id: 1 }); // wrong: an id is text, bytes or an integer
  await hg.scheduleMany([{ taskType: "t", id: "x", delayMs: "5" }]); // wrong: ms are numbers
  const sealed: "completed:callback" | "sealed" = await hg.groupSeal("g", "x"); // wrong: an object now
  const ended = await hg.waitUntilFinished("t", "x", { timeoutMs: 5 });
  if (ended.outcome === "retried") console.log(sealed); // wrong: retried is not an end
  const seconds: string = ended.finishedMs; // wrong: a number of ms, or null
  await hg.waitUntilFinished("t", "x", { timeout: 5 }); // wrong: the timeout is `timeoutMs`
  console.log(seconds);
}

// The QuickJS build's entry module (plugins/build-polyglot.sh): the prelude first, so the handler's own
// top-level code sees its globals, then the handler's `handle`, called with each task's start marked
// (Math.random is seeded afresh in every task) and what it throws made into a `failure`:
//
// - a failure value (`{ tag: "error" | "permanent" | "retry-after", val }`) is returned as it is, a
//   retry-after's BigInt as a number (QuickJS's bindings take numbers for u64, StarlingMonkey's both);
// - anything else thrown (an Error, a string) fails the attempt as an `error` with its text, where the
//   engine would otherwise abort the instance and the message would reach only stderr.
import { taskStarts } from "./prelude.js";
import { handle as handler } from "../handler.js";

const TAGS = new Set(["error", "permanent", "retry-after"]);

function asFailure(thrown) {
  if (thrown !== null && typeof thrown === "object" && TAGS.has(thrown.tag)) {
    if (thrown.tag === "retry-after") return { tag: "retry-after", val: Number(thrown.val) };
    return { tag: thrown.tag, val: String(thrown.val) };
  }
  if (thrown instanceof Error) return { tag: "error", val: `${thrown.name}: ${thrown.message}` };
  return { tag: "error", val: `uncaught ${typeof thrown}: ${String(thrown)}` };
}

export function handle(task) {
  taskStarts();
  try {
    return handler(task);
  } catch (thrown) {
    throw asFailure(thrown);
  }
}

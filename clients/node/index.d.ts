// Types of the Hourglass Node client (index.js); checked by `tsc --strict` in test/types.test.js.
// Every number of time is milliseconds, and its name says so (`delayMs`, `atMs`, `dueMs`, ...).
import type { Redis, Cluster } from "ioredis";

/** A task id: bytes, text, or an integer (written as its decimal text). */
export type Id = string | Buffer | Uint8Array | number | bigint;
/** A payload: bytes and text as they are; any other JSON-able value as its JSON text. */
export type Payload = string | Buffer | Uint8Array | number | boolean | object | null;
export type Mode = "upsert" | "if-absent" | "only-later" | "only-earlier";

/** When a task falls due: at most one of `at`, `atMs` and `delayMs`; none: now. */
export interface Due {
  /** Due at this time. */
  at?: Date;
  /** Due at this many ms since the epoch. */
  atMs?: number;
  /** Due this many ms from now. */
  delayMs?: number;
}

/** A durable schedule: Redis WAIT after the write; ReplicationTimeout when fewer replicas acknowledged in time. */
export interface DurableOptions {
  /** Replicas that must acknowledge the write (1 to 64); not on a Cluster client. */
  replicas?: number;
  /** How long WAIT waits for them, ms (default 1000). */
  replicasTimeoutMs?: number;
}

export interface ScheduleOptions extends Due, DurableOptions {
  payload?: Payload;
  /** Default "upsert". */
  mode?: Mode;
  /** W3C traceparent: the run's span continues this trace. */
  traceparent?: string;
}

/** One task of scheduleMany (no traceparent: use schedule for that). */
export interface NewTask extends Due {
  taskType: string;
  id: Id;
  payload?: Payload;
  mode?: Mode;
}

export interface Cancelled {
  state: "scheduled" | "running" | "unknown";
  /** Of a running task, the host id that holds it. */
  holder: string;
  /** A group's child: its group is told it was cancelled. */
  groupTold: boolean;
}

export interface Lease {
  host: string;
  attempt: number;
  token: number;
  untilMs: number;
}

export type TaskState = "scheduled" | "due" | "running" | "dead" | "unknown";

export interface TaskView {
  /** Its type; of a sharded type, the shard it is in (its tag). */
  taskType: string;
  id: Buffer;
  state: TaskState;
  nowMs: number;
  dueMs: number | null;
  running: Lease | null;
  diedMs: number | null;
  attempts: number;
  lastError: string | null;
  payloadSize: number;
  payload: Buffer | null;
  /** `<callback type>/<group id>` of a workflow group's child. */
  group: string | null;
  /** `<home type>/<graph id>` of a workflow graph's node, until it ends. */
  graph: string | null;
  shard: number | null;
  /** What its handler last reported (the `progress` import), kept across retries until it ends. */
  progress: Progress | null;
}

/** How far a task's handler got, as it last reported. */
export interface Progress {
  /** 0 to 100. */
  percent: number;
  /** The handler's detail, parsed from its JSON; null when it gave none. */
  detail: unknown;
  /** The attempt that reported it. */
  attempt: number;
  /** When it was reported, ms. */
  atMs: number;
}

export interface Stats {
  dueNow: number;
  scheduledLater: number;
  inFlight: number;
  dead: number;
  succeeded: number;
  failed: number;
  retried: number;
  deadTotal: number;
  cancelled: number;
  oldestDueAgeMs: number;
  groupsOpen: number;
  groupsCompleted: number;
  groupsFailed: number;
  /** Workflow graphs of this home type not done yet; declared, done, and done with a node that did not succeed. */
  graphsRunning: number;
  graphsOpened: number;
  graphsCompleted: number;
  graphsFailed: number;
  fault: string | null;
  /** null: not paused; 0: until resumed; else ms left until the pause ends. */
  pausedMs: number | null;
}

export interface Child {
  taskType: string;
  id: string;
  payload?: Payload;
  /** Due time in ms since the epoch (default: now). */
  dueMs?: number;
}

export interface Added {
  joined: number;
  refused: Array<[string, string]>;
}

export type Fired = "callback" | "skipped" | "kept";

/** What groupSeal did: sealed (children pending), completed now (nothing pending), or nothing (sealed or done before). */
export type Sealed = { state: "sealed"; fired: null } | { state: "completed"; fired: Fired } | { state: "already"; fired: null };

export interface GroupOpenOptions {
  /** The callback task's id (default: the group id). */
  callbackId?: string;
  /** The callback's payload, in the summary JSON: text, or a JSON-able value as its JSON text. */
  payload?: string | number | boolean | object | null;
  /** "all" (default): when every child ended; "success": only when all succeeded (a chain). */
  when?: "all" | "success";
  /** false: keep a callback task with that id that is waiting or dead. Default true. */
  replace?: boolean;
}

export interface GroupView {
  callbackType: string;
  group: string;
  state: "open" | "sealed" | "done";
  callbackId: string;
  when: "all" | "success";
  added: number;
  pending: number;
  succeeded: number;
  dead: number;
  cancelled: number;
  openedMs: number;
  completedMs: number | null;
  fired: Fired | null;
}

/** A node of a workflow graph to declare: a task that runs once its parents have ended as `when` says. */
export interface GraphNode {
  /** Its name in the graph, which its children's `parents` use: 1 to 200 bytes of text. */
  name: string;
  taskType: string;
  /** The task id (default `<graph id>/<name>`). */
  id?: string;
  /** Text as it is; anything else JSON-able as its JSON text. */
  payload?: Payload;
  /** "all" (default): once every parent ended, however; "success": only if all succeeded, else skipped. */
  when?: "all" | "success";
  /** Names of the nodes it waits for (default none: it runs at once). */
  parents?: string[];
}

/** What graphSubmit declared. */
export interface Declared {
  nodes: number;
  edges: number;
  /** Nodes without parents, scheduled at once. */
  roots: number;
}

export type NodeState = "waiting" | "scheduled" | "succeeded" | "dead" | "cancelled" | "skipped";

export interface NodeView {
  name: string;
  taskType: string;
  id: string;
  when: "all" | "success";
  state: NodeState;
  parents: string[];
  /** Parents it still waits for (while waiting). */
  waitingFor: number;
  /** Why it was skipped: `parent <name> dead|cancelled|skipped`. */
  reason: string | null;
}

export interface GraphView {
  homeType: string;
  graph: string;
  state: "running" | "done";
  edges: number;
  counts: Record<NodeState, number>;
  openedMs: number | null;
  completedMs: number | null;
  /** When it was cancelled (graphCancel), if it was. */
  cancelledMs: number | null;
  /** Every node, in the order declared. */
  nodes: NodeView[];
}

/** What graphCancel did. */
export interface GraphCancelled {
  /** The graph was done already: nothing changed. */
  wasDone: boolean;
  /** Waiting nodes skipped ("graph cancelled"). */
  skipped: number;
  /** Scheduled nodes whose tasks were removed before they ran. */
  removed: number;
  /** Scheduled nodes running: their hosts were asked to stop them. */
  stopping: number;
  /** Scheduled nodes that had ended already. */
  ended: number;
}

export type Outcome = "succeeded" | "dead" | "cancelled";

/** How a task ended (waitUntilFinished). */
export interface Ended {
  outcome: Outcome;
  /** The attempt that ended (1 = first). */
  attempt: number;
  /** The error text of a dead task. */
  error: string | null;
  /** When it ended, ms since the epoch; null for a task a client cancelled while it waited (no event). */
  finishedMs: number | null;
}

export interface HourglassOptions {
  /** The hosts' `[redis] prefix` (default "hourglass"). */
  prefix?: string;
  /** Each sharded type's `[types.T] shards`, as the hosts run it. */
  shards?: Record<string, number>;
}

export class Hourglass {
  constructor(redis: Redis | Cluster, options?: HourglassOptions);
  readonly redis: Redis | Cluster;
  readonly prefix: string;
  key(queue: string, suffix: string): string;
  shardFor(taskType: string, id: Id): string;
  schedule(taskType: string, id: Id, options?: ScheduleOptions): Promise<boolean>;
  /** Whether each due time was written, in input order. */
  scheduleMany(tasks: Iterable<NewTask>, options?: DurableOptions): Promise<boolean[]>;
  /** How the task ended (its type needs `events = true`); no `timeoutMs`: wait for ever. */
  waitUntilFinished(taskType: string, id: Id, options?: { timeoutMs?: number }): Promise<Ended>;
  postpone(taskType: string, id: Id, delayMs: number): Promise<number | null>;
  runNow(taskType: string, id: Id): Promise<number | null>;
  cancel(taskType: string, id: Id): Promise<Cancelled>;
  show(taskType: string, id: Id, options?: { payloadBytes?: number }): Promise<TaskView>;
  /** No `lengthMs`: until resumed (resolves to null); else when it ends, ms since the epoch. */
  pause(taskType: string, options?: { lengthMs?: number }): Promise<number | null>;
  resume(taskType: string): Promise<boolean>;
  stats(taskType: string): Promise<Stats>;
  groupOpen(callbackType: string, group: string, options?: GroupOpenOptions): Promise<boolean>;
  groupAdd(callbackType: string, group: string, children: Child[]): Promise<Added>;
  groupSeal(callbackType: string, group: string): Promise<Sealed>;
  groupShow(callbackType: string, group: string): Promise<GroupView | null>;
  /** Declares a graph whole (GraphRefused, nothing written, if anything is wrong) and schedules its roots. */
  graphSubmit(homeType: string, graph: string, nodes: GraphNode[]): Promise<Declared>;
  graphShow(homeType: string, graph: string): Promise<GraphView | null>;
  /** Skips what waits, cancels the nodes scheduled; null when there is no such graph. */
  graphCancel(homeType: string, graph: string): Promise<GraphCancelled | null>;
}

export function shardTags(taskType: string, n: number): readonly string[];
export function shardOf(id: string | Buffer, n: number): number;
export function taskType(name: string): string;
/** The due time (ms since the epoch) that `due` names, from `now` (default: this machine's clock). */
export function dueMs(due?: Due, now?: number): number;
export function nowMs(): number;
/** This package's version (package.json). */
export const version: string;

export type ErrorCode =
  | "HG_ERROR"
  | "HG_INVALID_TASK_TYPE"
  | "HG_INVALID_ID"
  | "HG_INVALID_ARGUMENT"
  | "HG_DATA_FAULT"
  | GroupRefusedCode
  | "HG_GRAPH_REFUSED"
  | "HG_NO_EVENTS"
  | "HG_WAIT_TIMEOUT"
  | "HG_REPLICATION_TIMEOUT"
  | "HG_UNKNOWN_TASK";
export type GroupRefusedCode = "HG_GROUP_REFUSED" | "HG_NO_SUCH_GROUP" | "HG_GROUP_CLOSED" | "HG_GROUP_CONFLICT";

/** Every error this client throws on purpose; `code` names its kind and never changes. */
export class HourglassError extends Error {
  constructor(message?: string, options?: { cause?: unknown });
  readonly code: ErrorCode;
  /** scheduleMany's InvalidArgument for a bad task: the error of that task. */
  cause?: unknown;
}
export class InvalidTaskType extends HourglassError {
  readonly code: "HG_INVALID_TASK_TYPE";
}
export class InvalidId extends HourglassError {
  readonly code: "HG_INVALID_ID";
}
export class InvalidArgument extends HourglassError {
  readonly code: "HG_INVALID_ARGUMENT";
}
export class DataFault extends HourglassError {
  readonly code: "HG_DATA_FAULT";
}
export class GroupRefused extends HourglassError {
  readonly code: GroupRefusedCode;
}
export class NoSuchGroup extends GroupRefused {
  readonly code: "HG_NO_SUCH_GROUP";
}
export class GroupClosed extends GroupRefused {
  readonly code: "HG_GROUP_CLOSED";
}
export class GroupConflict extends GroupRefused {
  readonly code: "HG_GROUP_CONFLICT";
}
export class GraphRefused extends HourglassError {
  readonly code: "HG_GRAPH_REFUSED";
}
export class NoEvents extends HourglassError {
  readonly code: "HG_NO_EVENTS";
}
export class WaitTimeout extends HourglassError {
  readonly code: "HG_WAIT_TIMEOUT";
}
/** `replicas: N`: written on the master, but fewer than N replicas acknowledged it in time. */
export class ReplicationTimeout extends HourglassError {
  readonly code: "HG_REPLICATION_TIMEOUT";
  /** Replicas that acknowledged the write. */
  readonly acked: number;
  /** Replicas asked for. */
  readonly wanted: number;
}
export class UnknownTask extends HourglassError {
  readonly code: "HG_UNKNOWN_TASK";
}

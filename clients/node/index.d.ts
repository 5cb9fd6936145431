// Types of the Hourglass Node client (index.js).
import type { Redis, Cluster } from "ioredis";

/** A task id: bytes, text, or an integer (written as its decimal text). */
export type Id = string | Buffer | Uint8Array | number | bigint;
/** A payload: bytes and text as they are; any other JSON-able value as its JSON text. */
export type Payload = string | Buffer | Uint8Array | number | boolean | object | null;
export type Mode = "upsert" | "if-absent" | "only-later" | "only-earlier";

export interface ScheduleOptions {
  /** Due time: a Date or ms since the epoch. */
  at?: Date | number;
  /** Due in this many ms from now (default 0: now). */
  delayMs?: number;
  payload?: Payload;
  mode?: Mode;
  /** W3C traceparent: the run's span continues this trace. */
  traceparent?: string;
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

export interface TaskView {
  /** Its type; of a sharded type, the shard it is in (its tag). */
  taskType: string;
  id: Buffer;
  state: "scheduled" | "due" | "running" | "dead" | "unknown";
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
  shard: number | null;
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
  fault: string | null;
  /** null: not paused; 0: until resumed; else ms until the pause ends. */
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
  fired: "callback" | "skipped" | "kept" | null;
}

export class Hourglass {
  constructor(redis: Redis | Cluster, options?: { prefix?: string; shards?: Record<string, number> });
  key(queue: string, suffix: string): string;
  shardFor(taskType: string, id: Id): string;
  schedule(taskType: string, id: Id, options?: ScheduleOptions): Promise<boolean>;
  postpone(taskType: string, id: Id, delayMs: number): Promise<number | null>;
  runNow(taskType: string, id: Id): Promise<number | null>;
  cancel(taskType: string, id: Id): Promise<Cancelled>;
  show(taskType: string, id: Id, options?: { payloadBytes?: number }): Promise<TaskView>;
  pause(taskType: string, options?: { lengthMs?: number }): Promise<number | null>;
  resume(taskType: string): Promise<boolean>;
  stats(taskType: string): Promise<Stats>;
  groupOpen(
    callbackType: string,
    group: string,
    options?: { callbackId?: string; payload?: string; when?: "all" | "success"; replace?: boolean },
  ): Promise<boolean>;
  groupAdd(callbackType: string, group: string, children: Child[]): Promise<Added>;
  groupSeal(callbackType: string, group: string): Promise<"sealed" | "already" | `completed:${string}`>;
  groupShow(callbackType: string, group: string): Promise<GroupView | null>;
}

export function shardTags(taskType: string, n: number): readonly string[];
export function shardOf(id: Id, n: number): number;
export function taskType(name: string): string;
export function dueMs(at?: Date | number | null, delayMs?: number | null): number;
export function nowMs(): number;

export class HourglassError extends Error {}
export class InvalidTaskType extends HourglassError {}
export class InvalidId extends HourglassError {}
export class InvalidArgument extends HourglassError {}
export class DataFault extends HourglassError {}
export class GroupRefused extends HourglassError {}
export class NoSuchGroup extends GroupRefused {}
export class GroupClosed extends GroupRefused {}
export class GroupConflict extends GroupRefused {}

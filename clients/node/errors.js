// The errors the client throws: a refusal is typed, so an application can match on it (instanceof),
// or on its stable `code` ("HG_INVALID_ID", ...) beside its `name`, as Node's own errors carry one.
"use strict";

/** Every error this client throws on purpose; `code` names its kind and never changes. */
class HourglassError extends Error {
  static code = "HG_ERROR";
  constructor(message, options) {
    super(message, options);
    this.name = this.constructor.name;
    this.code = this.constructor.code;
  }
}
/** A task type name the host would refuse: [a-z0-9][a-z0-9._-]{0,63}. */
class InvalidTaskType extends HourglassError {
  static code = "HG_INVALID_TASK_TYPE";
}
/** A task id, group id or callback id that cannot be used (empty, too long, control characters). */
class InvalidId extends HourglassError {
  static code = "HG_INVALID_ID";
}
/** Another argument out of its range or of the wrong kind: a mode, a `when`, a negative delay, an unknown option. */
class InvalidArgument extends HourglassError {
  static code = "HG_INVALID_ARGUMENT";
}
/** A key of the type holds data of the wrong kind (HGFAULT); the message names it and the fix. Nothing was written. */
class DataFault extends HourglassError {
  static code = "HG_DATA_FAULT";
}
/** A workflow group step the group's state refuses (HGGROUP); nothing was written. */
class GroupRefused extends HourglassError {
  static code = "HG_GROUP_REFUSED";
}
/** The group was never opened, or was done more than 7 days ago. */
class NoSuchGroup extends GroupRefused {
  static code = "HG_NO_SUCH_GROUP";
}
/** The group is sealed or done: no children can be added. */
class GroupClosed extends GroupRefused {
  static code = "HG_GROUP_CLOSED";
}
/** Opening a group that is open with another callback, or that already completed. */
class GroupConflict extends GroupRefused {
  static code = "HG_GROUP_CONFLICT";
}
/**
 * A workflow graph refused whole (HGGRAPH, or an id check before it): a cycle, an unknown parent, a
 * name or task used twice, a task in use, a graph id used before. Nothing was written.
 */
class GraphRefused extends HourglassError {
  static code = "HG_GRAPH_REFUSED";
}
/** waitUntilFinished: the type (or shard) has no events stream, so no end could ever be seen. */
class NoEvents extends HourglassError {
  static code = "HG_NO_EVENTS";
}
/** waitUntilFinished: the task did not end within `timeoutMs`. */
class WaitTimeout extends HourglassError {
  static code = "HG_WAIT_TIMEOUT";
}
/** waitUntilFinished: the task is not waiting, running or dead, and its events stream holds no end of it. */
class UnknownTask extends HourglassError {
  static code = "HG_UNKNOWN_TASK";
}

/**
 * `replicas: N`: the write is on the master, but fewer than N replicas acknowledged it in time (Redis
 * WAIT): it may be lost if the master fails now; scheduling it again is harmless.
 */
class ReplicationTimeout extends HourglassError {
  static code = "HG_REPLICATION_TIMEOUT";
  constructor(message, { acked = 0, wanted = 0 } = {}) {
    super(message);
    this.acked = acked;
    this.wanted = wanted;
  }
}

/** The typed error for a script's error reply, or `err` itself when it is none of ours. */
function fromReply(err) {
  const text = String(err && err.message);
  const fault = text.indexOf("HGFAULT ");
  if (fault >= 0) return new DataFault(text.slice(fault + 8).trim());
  const group = text.indexOf("HGGROUP ");
  if (group >= 0) {
    const why = text.slice(group + 8).trim();
    if (why.startsWith("no group")) return new NoSuchGroup(why);
    if (why.includes("no children can be added")) return new GroupClosed(why);
    return new GroupConflict(why);
  }
  const graph = text.indexOf("HGGRAPH ");
  if (graph >= 0) return new GraphRefused(text.slice(graph + 8).trim());
  return err;
}

module.exports = {
  HourglassError,
  InvalidTaskType,
  InvalidId,
  InvalidArgument,
  DataFault,
  GroupRefused,
  NoSuchGroup,
  GroupClosed,
  GroupConflict,
  GraphRefused,
  NoEvents,
  WaitTimeout,
  UnknownTask,
  ReplicationTimeout,
  fromReply,
};

// The errors the client throws: a refusal is typed, so an application can match on it (instanceof).
"use strict";

/** Every error this client throws on purpose. */
class HourglassError extends Error {
  constructor(message) {
    super(message);
    this.name = this.constructor.name;
  }
}
/** A task type name the host would refuse: [a-z0-9][a-z0-9._-]{0,63}. */
class InvalidTaskType extends HourglassError {}
/** A task id, group id or callback id that cannot be used (empty, too long, control characters). */
class InvalidId extends HourglassError {}
/** Another argument out of its range: a mode, a `when`, a negative delay, a shard count. */
class InvalidArgument extends HourglassError {}
/** A key of the type holds data of the wrong kind (HGFAULT); the message names it and the fix. Nothing was written. */
class DataFault extends HourglassError {}
/** A workflow group step the group's state refuses (HGGROUP); nothing was written. */
class GroupRefused extends HourglassError {}
/** The group was never opened, or was done more than 7 days ago. */
class NoSuchGroup extends GroupRefused {}
/** The group is sealed or done: no children can be added. */
class GroupClosed extends GroupRefused {}
/** Opening a group that is open with another callback, or that already completed. */
class GroupConflict extends GroupRefused {}

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
  fromReply,
};

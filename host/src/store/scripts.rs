//! The Lua scripts, each behind the shared prelude (`scripts/prelude.lua`), loaded once and run by SHA.
//!
//! Every script's header says its KEYS, its ARGV and what it guarantees; the
//! prelude states the rule they all follow: check everything that can fail
//! before the first write.

use redis::Script;

/// Every script the store runs.
pub(super) struct Scripts {
    pub(super) schedule: Script,
    pub(super) cancel: Script,
    pub(super) claim: Script,
    pub(super) settle: Script,
    pub(super) extend: Script,
    pub(super) release: Script,
    pub(super) deliver: Script,
    pub(super) dead_requeue: Script,
    pub(super) dead_purge: Script,
    pub(super) dead_list: Script,
    pub(super) stats: Script,
    pub(super) presence: Script,
    pub(super) holders: Script,
    pub(super) recur_put: Script,
    pub(super) recur_remove: Script,
    pub(super) recur_sync: Script,
    pub(super) pause: Script,
    pub(super) resume: Script,
    pub(super) show: Script,
    pub(super) reschedule: Script,
    pub(super) group_join: Script,
    pub(super) group_child: Script,
    pub(super) group_end: Script,
    pub(super) group_reports: Script,
}

/// `scripts/<name>.lua` behind the shared helpers of `scripts/prelude.lua`.
macro_rules! script {
    ($name:literal) => {
        Script::new(concat!(include_str!("scripts/prelude.lua"), include_str!(concat!("scripts/", $name, ".lua"))))
    };
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            schedule: script!("schedule"),
            cancel: script!("cancel"),
            claim: script!("claim"),
            settle: script!("settle"),
            extend: script!("extend"),
            release: script!("release"),
            deliver: script!("deliver"),
            dead_requeue: script!("dead_requeue"),
            dead_purge: script!("dead_purge"),
            dead_list: script!("dead_list"),
            stats: script!("stats"),
            presence: script!("presence"),
            holders: script!("holders"),
            recur_put: script!("recur_put"),
            recur_remove: script!("recur_remove"),
            recur_sync: script!("recur_sync"),
            pause: script!("pause"),
            resume: script!("resume"),
            show: script!("show"),
            reschedule: script!("reschedule"),
            group_join: script!("group_join"),
            group_child: script!("group_child"),
            group_end: script!("group_end"),
            group_reports: script!("group_reports"),
        }
    }
}

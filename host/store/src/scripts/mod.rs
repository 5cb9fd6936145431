//! The Lua scripts, each behind the shared prelude (`scripts/prelude.lua`), loaded once and run by SHA.
//!
//! Every script's header says its KEYS, its ARGV and what it guarantees; the
//! prelude states the rule they all follow: check everything that can fail
//! before the first write.

use redis::Script;

/// Every script the store runs (an application's build, without the `host`
/// feature, loads the host's scripts too and never runs them).
#[cfg_attr(not(feature = "host"), allow(dead_code))]
pub(super) struct Scripts {
    pub(super) schedule: Script,
    pub(super) schedule_batch: Script,
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
    pub(super) graph_open: Script,
    pub(super) graph_reports: Script,
    pub(super) graph_cancel: Script,
    pub(super) events_open: Script,
    pub(super) progress: Script,
}

/// The shared helpers every script starts with.
const PRELUDE: &str = include_str!("prelude.lua");

/// The prelude's reading of the server's clock, which a manual clock replaces.
#[cfg(feature = "manual-clock")]
const SERVER_CLOCK: &str =
    "local t = redis.call('TIME')\n  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)";

/// The source of `holders` (who holds which leases of a type; read-only),
/// prelude included: for a caller that must read the leases inside its own
/// `MULTI` (`EVAL` with KEYS tokens, claimed and ARGV most ids per host), as
/// the fault tests do at the instant they stall Redis. The store's own reader
/// is [`Store::holders`](crate::Store::holders).
pub fn holders_source() -> String {
    format!("{PRELUDE}{}", include_str!("holders.lua"))
}

/// `scripts/<name>.lua` behind `$prelude`.
macro_rules! script {
    ($prelude:expr, $name:literal) => {
        Script::new(&format!("{}{}", $prelude, include_str!(concat!($name, ".lua"))))
    };
}

impl Scripts {
    /// The scripts, reading "now" from Redis `TIME`.
    pub(super) fn new() -> Scripts {
        Scripts::with_prelude(PRELUDE)
    }

    /// The scripts, reading "now" (ms) from the integer at `key` instead of
    /// `TIME`: tests step time by hand with it (tests/store/model.rs), and a key
    /// outside the type's slot only works on one server.
    #[cfg(feature = "manual-clock")]
    pub(super) fn with_manual_clock(key: &str) -> Scripts {
        assert!(PRELUDE.contains(SERVER_CLOCK), "the prelude's now_ms changed: update SERVER_CLOCK");
        let manual = format!("return tonumber(redis.call('GET', '{}')) or 0", key.replace(['\\', '\''], ""));
        Scripts::with_prelude(&PRELUDE.replace(SERVER_CLOCK, &manual))
    }

    fn with_prelude(prelude: &str) -> Scripts {
        Scripts {
            schedule: script!(prelude, "schedule"),
            schedule_batch: script!(prelude, "schedule_batch"),
            cancel: script!(prelude, "cancel"),
            claim: script!(prelude, "claim"),
            settle: script!(prelude, "settle"),
            extend: script!(prelude, "extend"),
            release: script!(prelude, "release"),
            deliver: script!(prelude, "deliver"),
            dead_requeue: script!(prelude, "dead_requeue"),
            dead_purge: script!(prelude, "dead_purge"),
            dead_list: script!(prelude, "dead_list"),
            stats: script!(prelude, "stats"),
            presence: script!(prelude, "presence"),
            holders: script!(prelude, "holders"),
            recur_put: script!(prelude, "recur_put"),
            recur_remove: script!(prelude, "recur_remove"),
            recur_sync: script!(prelude, "recur_sync"),
            pause: script!(prelude, "pause"),
            resume: script!(prelude, "resume"),
            show: script!(prelude, "show"),
            reschedule: script!(prelude, "reschedule"),
            group_join: script!(prelude, "group_join"),
            group_child: script!(prelude, "group_child"),
            group_end: script!(prelude, "group_end"),
            group_reports: script!(prelude, "group_reports"),
            graph_open: script!(prelude, "graph_open"),
            graph_reports: script!(prelude, "graph_reports"),
            graph_cancel: script!(prelude, "graph_cancel"),
            events_open: script!(prelude, "events_open"),
            progress: script!(prelude, "progress"),
        }
    }
}

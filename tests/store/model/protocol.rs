//! The lease protocol (issue 36) checked exhaustively in small worlds with the Stateright model checker.

// Beside the random test against real Redis (the parent module), this restates the
// scripts' rules abstractly (maps and sets, not keys): claim with reaping and the
// hold rule, extend, settle, release, cancel, crashes, a workflow group's reports.
// Stateright visits every state a world of 2 hosts and 3 ids reaches and checks the
// invariants in each; each `sometimes` property must be reached too, so a model gone
// blind to a path fails. A World bounds the clock, the lease, the claim size, the
// tokens handed out, the client steps (schedule, cancel, ZREM, re-add) and the joins;
// hosts' actions, the seal and deliveries are free. Each client step multiplies the
// space about tenfold, hence two worlds: LEASES without the group, GROUP with it.
// Left out, as no invariant reads them: attempts (the random test checks them),
// payloads, throttles, recurring schedules. A crash restarts the host at once.

use std::collections::BTreeSet;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

mod redis;

const IDS: usize = 3;
const HOSTS: usize = 2;
/// The ids a client may add to the group.
const CHILDREN: [usize; 2] = [1, 2];
const RETRY_DELAY: u8 = 1;

/// The bounds of a world.
#[derive(Clone, Copy, Debug)]
struct World {
    last_tick: u8,
    lease: u8,
    /// The most ids one claim takes.
    limit: usize,
    /// Tokens handed out in all (then claims only reap and hold back).
    tokens: u8,
    /// Joins to the group in all.
    joins: u8,
    /// Client schedules, cancels and ZREMs in all.
    client_steps: u8,
}

const LEASES: World = World { last_tick: 2, lease: 1, limit: 2, tokens: 3, joins: 0, client_steps: 3 };
const GROUP: World = World { last_tick: 2, lease: 1, limit: 2, tokens: 2, joins: 2, client_steps: 1 };

const ONE_RUN: &str = "at most one live run per id";
const NONE_LOST: &str = "every scheduled id ends or stays scheduled";
const FENCED: &str = "a fenced outcome changes nothing";
const ONCE: &str = "the callback of a group fires once";
const FIRES: &str = "the callback fires";

/// Which rules the scripts follow: both on is the protocol; each off is a
/// broken variant that the checker must catch.
#[derive(Clone, Copy, Debug)]
struct Rules {
    /// A claim holds back an id whose earlier run still holds its lease (issue 36).
    hold: bool,
    /// A settle checks that its task is still leased under its claim and token.
    fencing: bool,
}

const PROTOCOL: Rules = Rules { hold: true, fencing: true };

struct Protocol {
    rules: Rules,
    world: World,
}

/// One claim: one lease for all its tasks. `no` is its first token, never reused.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Claim {
    no: u8,
    expiry: u8,
    /// The earliest due time of its tasks: where reaped tasks go back to.
    oldest: u8,
    /// Task k (from 0, token `no + k`): its id while it is leased, None once it left the claim.
    tasks: Vec<Option<u8>>,
}

/// An outbox entry: a group child's end, with the join it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Report {
    child: u8,
    join: u8,
    /// Ack, Dead or Cancel.
    end: Kind,
}

/// Open from the start: opening commutes with everything but adding and sealing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
enum Group {
    #[default]
    Open,
    Sealed,
    Done,
}

/// What Redis holds for the type (and the group in its callback's slot).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Redis {
    due: [Option<u8>; IDS],
    claims: Vec<Claim>,
    seq: u8, // the token counter
    dead: [bool; IDS],
    /// id -> the token whose cancel was asked.
    cancels: [Option<u8>; IDS],
    /// id -> the claim its run is in (the scripts keep a set of ids and find the claim among those in flight).
    running: [Option<u8>; IDS],
    /// id -> (original due, bumped due) while a claim holds it back.
    held: [Option<(u8, u8)>; IDS],
    /// id -> the join number it is the group's child under.
    member: [Option<u8>; IDS],
    outbox: Vec<Report>,
    group: Group,
    added: u8,
    /// child -> the join number it is pending under.
    pending: [Option<u8>; IDS],
    callbacks: u8, // how often the callback was put into its type's due set
}

/// A run in a host's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Run {
    id: u8,
    claim: u8,
    token: u8,
}

/// What the last step did (for the `sometimes` properties), and whether a fenced settle ever wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Seen {
    restored: bool,
    fenced: bool,
    reaped_cancelled: bool,
    lost: bool,
    fenced_changed: bool, // kept for good
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    redis: Redis,
    /// Each host's runs in memory.
    hosts: [Vec<Run>; HOSTS],
    /// Client schedules, cancels and ZREMs left.
    client_left: u8,
    /// Per id: a task of it is owed (set while it is due or leased; an ack, a
    /// cancel or a ZREM clears it): it must be due, leased or dead.
    owed: [bool; IDS],
    seen: Seen,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Ack,
    Retry,
    Dead,
    Cancel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Tick,
    Claim(usize),
    /// Host, index of its run.
    Renew(usize, usize),
    Settle(usize, usize, Kind),
    Release(usize, usize),
    Crash(usize),
    /// Client ZADD (upsert): id, due time.
    Schedule(usize, u8),
    Cancel(usize),
    /// Client ZREM of a due id (no cancel script: `held` and the group mark stay).
    Zrem(usize),
    /// group_join then group_child, as one step: a crash between them only leaves a child unscheduled.
    Add(usize),
    Seal,
    /// Deliver the first outbox entry to the group; `true` keeps it (its host died before the HDEL).
    Deliver(bool),
}

impl Protocol {
    /// claim.lua: reap expired claims, then take due ids oldest first under one new lease.
    fn claim(&self, s: &mut State, h: usize) {
        let now = s.now;
        let r = &mut s.redis;
        let (expired, kept): (Vec<Claim>, Vec<Claim>) =
            std::mem::take(&mut r.claims).into_iter().partition(|c| c.expiry <= now);
        r.claims = kept;
        for c in expired {
            for (k, id) in c.tasks.iter().enumerate().filter_map(|(k, t)| Some((k, (*t)? as usize))) {
                s.seen.restored |= r.left(id, c.no);
                if r.cancels[id] == Some(c.no + k as u8) {
                    // A run whose cancel was asked, and whose host died, is not run again.
                    r.cancels[id] = None;
                    r.report_ended(id, Kind::Cancel);
                    s.owed[id] = false;
                    s.seen.reaped_cancelled = true;
                } else {
                    // NX: a client's schedule wins.
                    r.zadd_nx(id, c.oldest.min(now));
                }
            }
        }
        let mut rows: Vec<(u8, usize)> =
            (0..IDS).filter_map(|id| r.due[id].filter(|&d| d <= now).map(|d| (d, id))).collect();
        rows.sort();
        // The first `limit` rows, as ZRANGEBYSCORE LIMIT reads them: a held one takes a slot.
        rows.truncate(self.world.limit);
        let mut taken = Vec::new();
        for (score, id) in rows {
            let earlier = r.running[id].and_then(|no| r.claim(no)).map(|c| c.expiry);
            match earlier {
                Some(expiry) if self.rules.hold => {
                    // A client moved the score since the last bump: its time is the original now.
                    let original = r.held[id].filter(|&(_, bumped)| bumped == score).map_or(score, |(o, _)| o);
                    r.held[id] = Some((original, expiry));
                    r.due[id] = Some(expiry);
                }
                _ if r.seq + (taken.len() as u8) < self.world.tokens => taken.push((score, id)),
                _ => {}
            }
        }
        let Some(&(oldest, _)) = taken.first() else { return };
        let no = r.seq + 1;
        r.seq += taken.len() as u8;
        let mut tasks = Vec::new();
        for (k, &(_, id)) in taken.iter().enumerate() {
            r.due[id] = None;
            r.dead[id] = false; // a dead id that a client scheduled again starts over
            tasks.push(Some(id as u8));
            r.running[id] = Some(no);
            s.hosts[h].push(Run { id: id as u8, claim: no, token: no + k as u8 });
        }
        r.claims.push(Claim { no, expiry: now + self.world.lease, oldest, tasks });
    }

    /// settle.lua for one task; fenced (nothing written) unless it is still leased.
    fn settle(&self, s: &mut State, run: Run, kind: Kind) {
        let before = s.redis.clone();
        let leased = before.leased(&run);
        if leased || !self.rules.fencing {
            let r = &mut s.redis;
            let id = run.id as usize;
            r.take_out(&run);
            s.seen.restored |= r.left(id, run.claim);
            let asked = r.cancels[id].take() == Some(run.token);
            // A failure of a run whose cancel was asked is a cancel: never retried.
            let kind = if asked && kind != Kind::Ack { Kind::Cancel } else { kind };
            let end = match kind {
                Kind::Ack | Kind::Cancel => Some(kind),
                Kind::Retry => {
                    r.zadd_nx(id, s.now + RETRY_DELAY);
                    None
                }
                // Rescheduled: a client scheduled it during the run, and that schedule stands.
                Kind::Dead if r.due[id].is_some() => None,
                Kind::Dead => {
                    r.dead[id] = true;
                    Some(kind)
                }
            };
            if let Some(end) = end {
                r.report_ended(id, end);
                s.owed[id] &= end == Kind::Dead;
            }
        }
        if !leased {
            s.seen.fenced = true;
            s.seen.fenced_changed |= s.redis != before;
        }
    }

    fn one_action(&self, s: &mut State, action: Action) {
        let now = s.now;
        match action {
            Action::Tick => s.now += 1,
            Action::Claim(h) => self.claim(s, h),
            Action::Renew(h, i) => {
                let run = s.hosts[h][i];
                if s.redis.leased(&run) {
                    // extend.lua: ZADD XX on the claim's lease, also when it expired but was not reaped.
                    s.redis.claims.iter_mut().find(|c| c.no == run.claim).unwrap().expiry = now + self.world.lease;
                } else {
                    // A lost lease stops its run.
                    s.hosts[h].remove(i);
                    s.seen.lost = true;
                }
            }
            Action::Settle(h, i, kind) => {
                let run = s.hosts[h].remove(i);
                self.settle(s, run, kind);
            }
            Action::Release(h, i) => {
                let run = s.hosts[h].remove(i);
                let r = &mut s.redis;
                if r.take_out(&run) {
                    s.seen.restored |= r.left(run.id as usize, run.claim);
                    r.zadd_nx(run.id as usize, now);
                }
            }
            // Its leases stay in Redis until they expire and a claim reaps them.
            Action::Crash(h) => s.hosts[h].clear(),
            Action::Schedule(id, at) => s.redis.due[id] = Some(at),
            Action::Cancel(id) => {
                let r = &mut s.redis;
                if r.due[id].take().is_some() {
                    r.held[id] = None;
                    r.report_ended(id, Kind::Cancel);
                    s.owed[id] = false;
                    return;
                }
                // Running (else not offered): its holder settles it as cancelled at its next renewal or settle.
                r.cancels[id] = r.live()[id].1;
            }
            Action::Zrem(id) => {
                s.redis.due[id] = None;
                s.owed[id] = false;
            }
            Action::Add(c) => {
                let r = &mut s.redis;
                // group_join: a child is counted once however often it is added while pending.
                let join = *r.pending[c].get_or_insert_with(|| {
                    r.added += 1;
                    r.added
                });
                // group_child: scheduled (replace) and marked as the group's, in one step.
                r.due[c] = Some(now);
                r.member[c] = Some(join);
            }
            Action::Seal => {
                let r = &mut s.redis;
                r.group = Group::Sealed;
                if r.pending.iter().all(Option::is_none) {
                    r.complete();
                }
            }
            Action::Deliver(keep) => {
                let r = &mut s.redis;
                let report = if keep { r.outbox[0] } else { r.outbox.remove(0) };
                // group_reports: counts once, for its join; the last child of a sealed group completes it.
                if r.counts(&report) {
                    r.pending[report.child as usize] = None;
                    if r.group == Group::Sealed && r.pending.iter().all(Option::is_none) {
                        r.complete();
                    }
                }
            }
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State { client_left: self.world.client_steps, ..State::default() }]
    }

    /// Only actions that change something: a no-op adds no state, only work.
    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let r = &s.redis;
        let now = s.now;
        if now < self.world.last_tick {
            out.push(Action::Tick);
        }
        for (h, host) in s.hosts.iter().enumerate() {
            if !host.is_empty() {
                out.push(Action::Crash(h));
            }
            if r.claims.iter().any(|c| c.expiry <= now) || r.due.iter().any(|d| d.is_some_and(|d| d <= now)) {
                out.push(Action::Claim(h));
            }
            for (i, run) in host.iter().enumerate() {
                let leased = r.leased(run);
                if !leased || r.claim(run.claim).is_some_and(|c| c.expiry < now + self.world.lease) {
                    out.push(Action::Renew(h, i));
                }
                out.extend([Kind::Ack, Kind::Retry, Kind::Dead].map(|k| Action::Settle(h, i, k)));
                if r.cancels[run.id as usize] == Some(run.token) {
                    out.push(Action::Settle(h, i, Kind::Cancel));
                }
                out.push(Action::Release(h, i));
            }
        }
        let live = r.live();
        for id in (0..IDS).filter(|_| s.client_left > 0) {
            for at in [now, now + 1] {
                if at <= self.world.last_tick && r.due[id] != Some(at) {
                    out.push(Action::Schedule(id, at));
                }
            }
            let asked = live[id].1.is_some_and(|token| r.cancels[id] != Some(token));
            if r.due[id].is_some() || asked {
                out.push(Action::Cancel(id));
            }
            if r.due[id].is_some() {
                out.push(Action::Zrem(id));
            }
        }
        match r.group {
            _ if self.world.joins == 0 => {}
            Group::Open => {
                out.push(Action::Seal);
                for c in CHILDREN {
                    // Adding a pending child again schedules it again: a client step.
                    let again = r.pending[c].is_some_and(|j| r.member[c] != Some(j) || r.due[c] != Some(now));
                    if (again && s.client_left > 0) || (r.pending[c].is_none() && r.added < self.world.joins) {
                        out.push(Action::Add(c));
                    }
                }
            }
            Group::Sealed | Group::Done => {}
        }
        // Deliveries of different reports commute (each counts its own child): the first stands for all.
        if let Some(report) = r.outbox.first() {
            out.push(Action::Deliver(false));
            if r.counts(report) {
                out.push(Action::Deliver(true));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let again = matches!(action, Action::Add(c) if last.redis.pending[c].is_some());
        if again || matches!(action, Action::Schedule(..) | Action::Cancel(_) | Action::Zrem(_)) {
            s.client_left -= 1;
        }
        // Events are what this step did: kept one step only, they add few states.
        s.seen = Seen { fenced_changed: last.seen.fenced_changed, ..Seen::default() };
        self.one_action(&mut s, action);
        for ((owed, due), live) in s.owed.iter_mut().zip(s.redis.due).zip(s.redis.live()) {
            *owed |= due.is_some() || live.0 > 0;
        }
        // Hosts are alike: a canonical order (symmetry reduction) halves the space.
        for host in &mut s.hosts {
            host.sort();
        }
        s.hosts.sort();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(ONE_RUN, |_, s: &State| one_run_per_id(s)),
            Property::always(NONE_LOST, |_, s: &State| {
                let r = &s.redis;
                let live = r.live();
                (0..IDS).all(|id| r.due[id].is_some() || live[id].0 > 0 || r.dead[id] || !s.owed[id])
            }),
            Property::always(FENCED, |_, s: &State| !s.seen.fenced_changed),
            Property::always(ONCE, |_, s: &State| s.redis.callbacks <= 1),
            Property::sometimes(FIRES, |_, s: &State| s.redis.callbacks == 1),
            Property::sometimes("a claim holds back an id whose earlier run holds its lease", |_, s: &State| {
                s.redis.held.iter().any(Option::is_some)
            }),
            Property::sometimes("a held id goes back to its own due time", |_, s: &State| s.seen.restored),
            Property::sometimes("an outcome is fenced", |_, s: &State| s.seen.fenced),
            // Only a reap drops a claim that a host still runs a task of.
            Property::sometimes("a lease is reaped under its running host", |_, s: &State| {
                s.hosts.iter().flatten().any(|run| s.redis.claim(run.claim).is_none())
            }),
            Property::sometimes("a reaped run whose cancel was asked ends", |_, s: &State| s.seen.reaped_cancelled),
            Property::sometimes("a renewal finds its lease lost", |_, s: &State| s.seen.lost),
            // Only a crash leaves a live task that no host runs.
            Property::sometimes("a crashed host's lease is left to expire", |_, s: &State| {
                s.redis.claims.iter().any(|c| {
                    c.tasks
                        .iter()
                        .enumerate()
                        .any(|(k, t)| t.is_some() && !s.hosts.iter().flatten().any(|run| run.token == c.no + k as u8))
                })
            }),
        ];
        properties.retain(|p| self.world.joins > 0 || p.name != FIRES);
        properties
    }
}

/// No id is live in two claims, nor held by two runs in hosts' memory whose claims both still exist.
fn one_run_per_id(s: &State) -> bool {
    let (r, runs) = (&s.redis, s.hosts.iter().flatten());
    let unreaped = |id| runs.clone().filter(|run| run.id as usize == id && r.claim(run.claim).is_some()).count();
    (0..IDS).all(|id| r.live()[id].0 <= 1 && unreaped(id) <= 1)
}

/// Runs the BFS checker to the end, or until the named property has a discovery.
fn check(name: &str, rules: Rules, world: World, until: Option<&'static str>) -> impl Checker<Protocol> {
    let started = Instant::now();
    // One thread when looking for a counterexample: the same one every run.
    let mut builder = Protocol { rules, world }.checker().threads(if until.is_some() { 1 } else { 2 });
    if let Some(property) = until {
        builder = builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])));
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "exhaustive check of {name} ({rules:?}): {} states, {} unique, depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

#[test]
fn the_protocol_holds_in_every_state_of_small_worlds() {
    check("LEASES", PROTOCOL, LEASES, None).assert_properties();
    check("GROUP", PROTOCOL, GROUP, None).assert_properties();
}

#[test]
fn without_the_hold_rule_a_rerun_overlaps_its_earlier_run() {
    let path = check("LEASES", Rules { hold: false, ..PROTOCOL }, LEASES, Some(ONE_RUN)).discovery(ONE_RUN);
    println!("counterexample: {:?}", path.expect("two runs of one id overlap").into_actions());
}

#[test]
fn without_fencing_a_stale_outcome_is_caught() {
    let path = check("LEASES", Rules { fencing: false, ..PROTOCOL }, LEASES, Some(FENCED)).discovery(FENCED);
    println!("counterexample: {:?}", path.expect("a stale outcome writes").into_actions());
}

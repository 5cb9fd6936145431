//! Following the master: one server's connection that moves when Redis fails over (Sentinel, or an endpoint whose node was demoted).
//!
//! A single server is reached through a [`Master`]: the connection manager of
//! the node that is master now, swapped for a new one when that changes.
//! Two things make it look again:
//!
//! - a call fails in a way a failover causes: `READONLY` (the node was
//!   demoted to replica) or `MASTERDOWN`; with Sentinel, also a dropped or
//!   refused connection;
//! - with Sentinel, a call unanswered for [`STALL_AFTER`] (a stalled master),
//!   a `+switch-master` message from a sentinel, or a check every [`CHECK_EVERY`].
//!
//! Looking again asks the sentinels (through redis-rs's `SentinelClient`,
//! which also checks that the node it names calls itself master), or, for a
//! plain URL, connects to it afresh (a managed endpoint's name now leads to
//! the new primary). While a failover runs the sentinels name no master; the
//! replica they promoted is master up to a second before they say so, so the
//! replicas they list are asked too (`ROLE`). Looking goes on every
//! [`LOOK_GAP`] until the master moved or answers again. A node that answers
//! `ROLE` as master replaces the old connection; calls still waiting on the
//! old one end at once with an I/O error, which callers retry as they retry
//! any outage: every script checks its fencing before it writes, so a
//! retried call neither loses nor doubles a task.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Result, bail};
use arc_swap::ArcSwap;
use futures_util::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Value};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::target::Target;

/// How often a Sentinel-followed master is checked without any other reason.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);
/// Least time between two look-ups: a burst of failed calls asks once.
const LOOK_GAP: Duration = Duration::from_millis(100);
/// How long the one attempt that explains a failed connect may take.
const DIAGNOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// What a call still waiting on the old master ends with: an I/O error, retried like an outage.
const MOVED_DURING_CALL: &str = "the Redis master changed during the call";
/// A call unanswered this long makes a Sentinel-followed host look for the master (it may be stalled).
const STALL_AFTER: Duration = Duration::from_secs(1);
/// How long a look-up waits for the sentinels and the master they name.
const SENTINEL_ANSWER: Duration = Duration::from_millis(500);
/// How long one round of looking goes on while the master stays unreachable.
const LOOK_FOR: Duration = Duration::from_secs(60);

/// The connection to whichever node is master now; cheap to clone.
#[derive(Clone)]
pub struct Master {
    inner: Arc<Inner>,
}

struct Inner {
    locate: Locate,
    now: ArcSwap<Current>,
    /// Bumped at each change of master; waiting calls and listeners watch it.
    changes: watch::Sender<u64>,
    /// A look-up is queued or running.
    looking: AtomicBool,
    /// When the last look-up began (ms since the epoch), for [`LOOK_GAP`].
    looked_ms: AtomicU64,
    shown: String,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Inner {
    /// The master is found through Sentinel (not a fixed URL).
    fn is_sentinel(&self) -> bool {
        matches!(self.locate, Locate::Sentinel(..))
    }
}

/// How to find the master.
// One per store: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Locate {
    /// One URL: a fresh connection to it.
    Url(redis::Client),
    /// Ask these sentinels.
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>, Target),
}

/// The master in use.
struct Current {
    manager: ConnectionManager,
    client: redis::Client,
    /// `host:port` (or the socket path).
    addr: String,
    /// When it became the one in use, ms since the epoch.
    since_ms: i64,
}

/// The master in use, as the dashboard and `/readyz` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterInfo {
    /// Its address (`host:port`).
    pub addr: String,
    /// When this host began to use it, ms since the epoch.
    pub since_ms: i64,
    /// How many times this host changed master since it started.
    pub changes: u64,
    /// Found through Sentinel (rather than a fixed URL).
    pub sentinel: bool,
}

impl Master {
    /// Finds the master (asking the sentinels when `target` names them) and connects to it.
    pub(crate) async fn connect(
        target: &Target,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Master> {
        let shown = target.shown();
        let (locate, client) = match target.sentinel_client()? {
            Some(mut sentinel) => {
                let ask = sentinel.async_get_client();
                let client = match tokio::time::timeout(connect_timeout, ask).await {
                    Ok(Ok(client)) => client,
                    Ok(Err(e)) => bail!("cannot find the Redis {shown}: {}", sentinel_error(target, &e)),
                    Err(_) => bail!(
                        "cannot find the Redis {shown}: no sentinel answered within {}s",
                        connect_timeout.as_secs()
                    ),
                };
                (Locate::Sentinel(tokio::sync::Mutex::new(sentinel), target.clone()), client)
            }
            None => {
                let client = target.client()?;
                (Locate::Url(client.clone()), client)
            }
        };
        let shown_master =
            if target.sentinel().is_some() { format!("{} ({shown})", addr_of(&client)) } else { shown.clone() };
        let manager = single(&client, &shown_master, target, connect_timeout, response_timeout).await?;
        let current = Current { addr: addr_of(&client), manager, client, since_ms: now_ms() };
        let master = Master {
            inner: Arc::new(Inner {
                locate,
                now: ArcSwap::from_pointee(current),
                changes: watch::Sender::new(0),
                looking: AtomicBool::new(false),
                looked_ms: AtomicU64::new(0),
                shown,
                connect_timeout,
                response_timeout,
            }),
        };
        if master.inner.is_sentinel() {
            tokio::spawn(watch_sentinels(Arc::downgrade(&master.inner)));
        }
        Ok(master)
    }

    /// A client of the master in use now (pub/sub, `CONFIG`).
    pub fn client(&self) -> redis::Client {
        self.inner.now.load().client.clone()
    }

    /// The master in use, and how often it changed.
    pub fn info(&self) -> MasterInfo {
        let now = self.inner.now.load();
        MasterInfo {
            addr: now.addr.clone(),
            since_ms: now.since_ms,
            changes: *self.inner.changes.borrow(),
            sentinel: self.inner.is_sentinel(),
        }
    }

    /// A receiver whose value changes each time the master does.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Sends `request` to the master in use. When the master changes while it
    /// waits, it ends at once with an I/O error (the caller retries it on the
    /// new one); a failure that a failover causes starts a look-up.
    ///
    /// `refused` finds a refusal in a reply: redis-rs returns a server's error
    /// reply (`READONLY`) as a value, made an error only when it is read.
    pub(crate) fn call<'a, T: Send + 'a>(
        &'a self,
        request: impl FnOnce(ConnectionManager) -> redis::RedisFuture<'a, T> + Send + 'a,
        refused: fn(&T) -> Option<&str>,
    ) -> redis::RedisFuture<'a, T> {
        // Subscribed before the load: a change between the two is still seen.
        let mut changed = self.inner.changes.subscribe();
        let manager = self.inner.now.load().manager.clone();
        let fut = request(manager);
        Box::pin(async move {
            tokio::pin!(fut);
            // Only a Sentinel-followed host has somewhere to look: the others arm no timer.
            let stall = tokio::time::sleep(STALL_AFTER);
            tokio::pin!(stall);
            let mut stalled = !self.inner.is_sentinel();
            let result = loop {
                tokio::select! {
                    biased;
                    result = &mut fut => break result,
                    // Already moved: nothing to look for.
                    _ = changed.changed() => return Err(RedisError::from((redis::ErrorKind::Io, MOVED_DURING_CALL))),
                    // Still waiting: the master may be stalled (a failover on its way). Look, and wait on.
                    _ = &mut stall, if !stalled => {
                        stalled = true;
                        self.look_soon("the master has not answered for a second");
                    }
                }
            };
            let sign = match &result {
                Err(e) => self.failover_sign(e),
                Ok(reply) => refused(reply).and_then(failover_code),
            };
            if let Some(why) = sign {
                self.look_soon(why);
            }
            result
        })
    }

    /// Whether `e` may mean the master moved, and in what words.
    fn failover_sign(&self, e: &RedisError) -> Option<&'static str> {
        if let Some(why) = e.code().and_then(failover_code) {
            return Some(why);
        }
        (self.inner.is_sentinel()
            && (e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()))
        .then_some("the connection to the master failed")
    }

    /// Starts looking for the master unless that is under way: every
    /// [`LOOK_GAP`] until it moved, or until the master in use answers
    /// again, for at most [`LOOK_FOR`] (a later failure starts it again).
    fn look_soon(&self, why: &'static str) {
        if self.inner.looking.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + LOOK_FOR;
            loop {
                let gap = LOOK_GAP.as_millis() as u64;
                let since = (now_ms() as u64).saturating_sub(inner.looked_ms.load(Ordering::Relaxed));
                if since < gap {
                    tokio::time::sleep(Duration::from_millis(gap - since)).await;
                }
                match look(&inner, why).await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => tracing::debug!("looking for the Redis master: {e:#}"),
                }
                // The master in use answers (it came back, or another call moved there).
                if answers(&inner).await {
                    break;
                }
                if tokio::time::Instant::now() > until {
                    break;
                }
            }
            inner.looking.store(false, Ordering::Release);
        });
    }
}

/// What an error code says of a failover, if anything.
fn failover_code(code: &str) -> Option<&'static str> {
    match code {
        "READONLY" => Some("the node answered READONLY: it is a replica now"),
        "MASTERDOWN" => Some("the node answered MASTERDOWN"),
        _ => None,
    }
}

/// The code of a server's error reply (a value, as redis-rs returns it).
fn refused_value(reply: &Value) -> Option<&str> {
    match reply {
        Value::ServerError(e) => Some(e.code()),
        _ => None,
    }
}

/// The first error code among a pipeline's replies.
#[allow(clippy::ptr_arg)] // `call` takes a `fn(&T)`, and here T is the Vec
fn refused_values(replies: &Vec<Value>) -> Option<&str> {
    replies.iter().find_map(refused_value)
}

/// Whether the master in use answers `PING` within a moment.
async fn answers(inner: &Inner) -> bool {
    let mut conn = inner.now.load().manager.clone();
    let ping = redis::cmd("PING");
    matches!(tokio::time::timeout(LOOK_GAP * 2, ping.query_async::<String>(&mut conn)).await, Ok(Ok(_)))
}

/// Finds the master now and moves to it when it is another node (for a
/// plain URL: whenever a fresh connection finds a master, since the old
/// connection was refused writes). Returns whether it moved.
async fn look(inner: &Inner, why: &str) -> Result<bool> {
    inner.looked_ms.store(now_ms() as u64, Ordering::Relaxed);
    let client = match &inner.locate {
        Locate::Url(client) => client.clone(),
        Locate::Sentinel(sentinel, target) => {
            let mut sentinel = sentinel.lock().await;
            // The sentinels name no master while a failover runs, and the one
            // they name may be stalled (its ROLE check then hangs): the replica
            // they promoted is master before they say so.
            let why_not = match tokio::time::timeout(SENTINEL_ANSWER, sentinel.async_get_client()).await {
                Ok(Ok(client)) => Ok(client),
                Ok(Err(e)) => Err(format!("the sentinels name no master now: {e}")),
                Err(_) => {
                    Err(format!("no master named by the sentinels answered within {} ms", SENTINEL_ANSWER.as_millis()))
                }
            };
            match why_not {
                Ok(client) => client,
                Err(why_not) => match promoted_replica(&mut sentinel, target, &inner.now.load().addr).await {
                    Some(client) => client,
                    None => bail!("{why_not}"),
                },
            }
        }
    };
    let addr = addr_of(&client);
    let old = inner.now.load_full();
    if inner.is_sentinel() && addr == old.addr {
        return Ok(false);
    }
    let manager = match manager_of(&client, inner.connect_timeout, inner.response_timeout).await {
        Ok(manager) => manager,
        Err(Some(e)) => bail!("cannot connect to {addr}: {e}"),
        Err(None) => bail!("{addr} did not answer within {}s", inner.connect_timeout.as_secs()),
    };
    if !is_master(&manager).await {
        bail!("{addr} is not a master (yet)");
    }
    inner.now.store(Arc::new(Current { manager, client, addr: addr.clone(), since_ms: now_ms() }));
    inner.changes.send_modify(|n| *n += 1);
    if addr == old.addr {
        warn!(master = %addr, "Redis at {} refused writes ({why}): reconnected, and it is a master again", inner.shown);
    } else {
        warn!(from = %old.addr, to = %addr, "Redis master changed ({why}): calls go to the new master");
    }
    Ok(true)
}

/// During a failover (the sentinels flag the master down or failing
/// over), the replica they list that calls itself master (`ROLE`), other than `old`. A sentinel announces a promotion only
/// after its next look at the promoted replica, up to a second later; asking
/// the replica itself resumes work within [`LOOK_GAP`] of the promotion.
async fn promoted_replica(
    sentinel: &mut redis::sentinel::SentinelClient,
    target: &Target,
    old: &str,
) -> Option<redis::Client> {
    let master = &target.sentinel()?.master;
    let client = sentinel.async_get_sentinel_client().await.ok()?;
    let mut conn = tokio::time::timeout(LOOK_GAP * 5, client.get_multiplexed_async_connection()).await.ok()?.ok()?;
    // Only while the master is down or being failed over: a node that calls
    // itself master at another time (an old master restarted before the
    // sentinels demote it) is not the one to follow.
    let entry: std::collections::HashMap<String, String> =
        redis::cmd("SENTINEL").arg("MASTER").arg(master).query_async(&mut conn).await.ok()?;
    let flags = entry.get("flags").map(String::as_str).unwrap_or_default();
    if !(flags.contains("s_down") || flags.contains("o_down") || flags.contains("failover")) {
        return None;
    }
    let replicas: Vec<std::collections::HashMap<String, String>> =
        redis::cmd("SENTINEL").arg("REPLICAS").arg(master).query_async(&mut conn).await.ok()?;
    for replica in replicas {
        let flags = replica.get("flags").map(String::as_str).unwrap_or_default();
        if flags.contains("s_down") || flags.contains("o_down") || flags.contains("disconnected") {
            continue;
        }
        let (Some(ip), Some(port)) = (replica.get("ip"), replica.get("port").and_then(|p| p.parse::<u16>().ok()))
        else {
            continue;
        };
        if format!("{ip}:{port}") == old {
            continue;
        }
        let Ok(client) = target.sentinel_node_client(ip, port) else { continue };
        let Ok(Ok(mut conn)) = tokio::time::timeout(LOOK_GAP * 5, client.get_multiplexed_async_connection()).await
        else {
            continue;
        };
        let role: redis::RedisResult<Vec<Value>> = redis::cmd("ROLE").query_async(&mut conn).await;
        if role.ok().and_then(|r| r.into_iter().next()).is_some_and(|r| is_master_word(&r)) {
            return Some(client);
        }
    }
    None
}

/// While the [`Master`] lives: listens for `+switch-master` on a sentinel
/// and looks again at each, and every [`CHECK_EVERY`] in any case.
async fn watch_sentinels(inner: Weak<Inner>) {
    loop {
        let subscription = async {
            let strong = inner.upgrade()?;
            let Locate::Sentinel(sentinel, _) = &strong.locate else { return None };
            let client = sentinel.lock().await.async_get_sentinel_client().await.ok()?;
            let mut pubsub =
                tokio::time::timeout(strong.connect_timeout, client.get_async_pubsub()).await.ok()?.ok()?;
            pubsub.subscribe("+switch-master").await.ok()?;
            Some(pubsub)
        };
        let pubsub = subscription.await;
        let mut messages = pubsub.map(|p| p.into_on_message());
        loop {
            let switched = async {
                match messages.as_mut() {
                    Some(m) => m.next().await.is_some(),
                    None => std::future::pending().await,
                }
            };
            let message = tokio::select! {
                got = switched => Some(got),
                _ = tokio::time::sleep(CHECK_EVERY) => None,
            };
            let Some(strong) = inner.upgrade() else { return };
            match message {
                Some(true) => {
                    info!("a sentinel announced +switch-master: looking for the new master");
                    let _ = look(&strong, "a sentinel announced +switch-master").await;
                }
                // The subscription closed: subscribe again (another sentinel, maybe).
                Some(false) => break,
                None => {
                    if let Err(e) = look(&strong, "the periodic check").await {
                        tracing::debug!("Sentinel check: {e:#}");
                    }
                    if messages.is_none() {
                        break;
                    }
                }
            }
        }
    }
}

/// Why connecting took longer than `waited`: the connection manager and the
/// cluster client retry every failure, a refused TLS certificate or password
/// too, until the timeout hides it. One more plain attempt names the cause.
pub(crate) async fn why_no_answer(client: &redis::Client, target: &Target, waited: Duration) -> String {
    let config = redis::AsyncConnectionConfig::new().set_connection_timeout(Some(DIAGNOSE_TIMEOUT));
    let attempt = client.get_multiplexed_async_connection_with_config(&config);
    match tokio::time::timeout(DIAGNOSE_TIMEOUT, attempt).await {
        Ok(Err(e)) => target.scrub(&e.to_string()),
        _ => format!("no answer within {}s", waited.as_secs()),
    }
}

/// A connection manager to one server: reconnects by itself after a fault
/// (to the same address; [`Master`] moves it when the master changes).
async fn single(
    client: &redis::Client,
    shown: &str,
    target: &Target,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> Result<ConnectionManager> {
    match manager_of(client, connect_timeout, response_timeout).await {
        Ok(conn) => Ok(conn),
        Err(Some(e)) => bail!("cannot connect to Redis at {shown}: {}", target.scrub(&e.to_string())),
        Err(None) => {
            bail!("cannot connect to Redis at {shown}: {}", why_no_answer(client, target, connect_timeout).await)
        }
    }
}

/// What the sentinels' refusal at start means, in one line.
fn sentinel_error(target: &Target, e: &RedisError) -> String {
    let master = target.sentinel().map(|s| s.master.as_str()).unwrap_or_default();
    match e.kind() {
        redis::ErrorKind::MasterNameNotFoundBySentinel => {
            format!(
                "no sentinel names a reachable master '{master}' (check the name, as in `sentinel monitor {master} ...`)"
            )
        }
        redis::ErrorKind::AuthenticationFailed => {
            format!("a sentinel refused the credentials: {}", target.scrub(&e.to_string()))
        }
        _ => target.scrub(&e.to_string()),
    }
}

/// A connection manager of `client`; `Err(None)`: no answer within `connect_timeout`.
async fn manager_of(
    client: &redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> Result<ConnectionManager, Option<RedisError>> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(response_timeout));
    match tokio::time::timeout(connect_timeout, ConnectionManager::new_with_config(client.clone(), config)).await {
        Ok(r) => r.map_err(Some),
        Err(_) => Err(None),
    }
}

/// Whether the node calls itself master (`ROLE`).
async fn is_master(manager: &ConnectionManager) -> bool {
    let mut conn = manager.clone();
    let role: redis::RedisResult<Vec<Value>> = redis::cmd("ROLE").query_async(&mut conn).await;
    role.ok().and_then(|r| r.into_iter().next()).is_some_and(|r| is_master_word(&r))
}

/// The first word of a `ROLE` reply is `master`.
fn is_master_word(role: &Value) -> bool {
    match role {
        Value::BulkString(b) => b == b"master",
        Value::SimpleString(s) => s == "master",
        _ => false,
    }
}

fn addr_of(client: &redis::Client) -> String {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        redis::ConnectionAddr::Unix(path) => path.display().to_string(),
        other => format!("{other:?}"),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl ConnectionLike for Master {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        let this: &'a Master = self;
        this.call(move |mut m| Box::pin(async move { m.req_packed_command(cmd).await }), refused_value)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        let this: &'a Master = self;
        this.call(
            move |mut m| Box::pin(async move { m.req_packed_commands(pipeline, offset, count).await }),
            refused_values,
        )
    }

    fn get_db(&self) -> i64 {
        self.inner.now.load().manager.get_db()
    }
}

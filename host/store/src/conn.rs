//! The connection: one server (auto-reconnecting, following its master through failovers) or a Redis Cluster, cluster topology, and what a failed call means.

use std::time::Duration;

use redis::Value;

use crate::follow::Master;

/// How long `connect` waits for Redis to answer before giving up.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Big claims and settles run for a while inside Redis; only a dead server should time out.
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// One shared connection: to a single server (auto-reconnecting, and moving
/// to the new master after a failover) or to a Redis Cluster (follows
/// MOVED/ASK and topology changes); cheap to clone.
#[derive(Clone)]
pub struct Conn(pub(super) ConnKind);

#[derive(Clone)]
pub(super) enum ConnKind {
    Single(Master),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match &mut self.0 {
            ConnKind::Single(c) => c.req_packed_command(cmd),
            ConnKind::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            ConnKind::Single(c) => c.req_packed_commands(pipeline, offset, count),
            ConnKind::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            ConnKind::Single(c) => c.get_db(),
            ConnKind::Cluster(c) => c.get_db(),
        }
    }
}

/// A node of a Redis Cluster, from `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Host or IP the node announces.
    pub host: String,
    /// Its client port.
    pub port: u16,
    /// A master (serves slots) rather than a replica.
    pub master: bool,
    /// The slot ranges it serves (masters only; importing/migrating markers left out).
    pub slots: Vec<std::ops::RangeInclusive<u16>>,
}

/// `CLUSTER NODES` text → nodes that are up and have an address, with the
/// slots each master serves: the one parser of it.
/// A line: `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <state> <slots>...`
pub fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    let mut nodes = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if flags.iter().any(|f| matches!(*f, "fail" | "noaddr" | "handshake")) {
            continue;
        }
        let addr = addr.split(['@', ',']).next().unwrap_or_default();
        let Some((host, port)) = addr.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        if host.is_empty() || port == 0 {
            continue;
        }
        let slots = fields
            .iter()
            .skip(8)
            .filter_map(|r| match r.split_once('-') {
                Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
                None => r.parse().ok().map(|s| s..=s),
            })
            .collect();
        nodes.push(ClusterNode { host: host.to_owned(), port, master: flags.contains(&"master"), slots });
    }
    nodes.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    nodes
}

/// What a failed Redis call means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trouble {
    /// The connection (or the server as a whole) is not usable now.
    Outage,
    /// Something about the data of the type the call concerned, described.
    Data(String),
}

/// Sorts an error from a Redis call into [`Trouble`].
pub fn classify(e: &anyhow::Error) -> Trouble {
    let Some(redis) = e.chain().find_map(|c| c.downcast_ref::<redis::RedisError>()) else {
        // Our own checks of a reply (a malformed answer) are about the data too.
        return Trouble::Data(format!("{e:#}"));
    };
    let code = redis.code().unwrap_or_default();
    let detail = redis.detail().unwrap_or_default();
    let about_data = match code {
        // HGFAULT: the scripts' own check of key types and numbers (scripts/prelude.lua).
        "HGFAULT" | "WRONGTYPE" => true,
        // A script that failed for another reason did so on this type's data.
        "ERR" => detail.contains("script"),
        _ => false,
    };
    if about_data {
        let text = if code == "HGFAULT" { detail.to_owned() } else { format!("{code} {detail}") };
        Trouble::Data(text)
    } else {
        Trouble::Outage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_with_their_slots() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001,node-b master - 0 0 2 connected 5461-10922 12000
c3 127.0.0.1:7002@17002 slave b2 0 0 2 connected
d4 127.0.0.1:7003@17003 master - 0 0 3 connected 10923-11999 12001-16383 [5-<-a1]
e5 127.0.0.1:7004@17004 master,fail - 0 0 4 disconnected
f6 :0@0 master,noaddr - 0 0 5 disconnected
";
        let nodes = parse_cluster_nodes(text);
        let summary: Vec<(u16, bool, Vec<std::ops::RangeInclusive<u16>>)> =
            nodes.into_iter().map(|n| (n.port, n.master, n.slots)).collect();
        assert_eq!(
            summary,
            vec![
                (7000, true, vec![0..=5460]),
                (7001, true, vec![5461..=10922, 12000..=12000]),
                (7002, false, vec![]),
                (7003, true, vec![10923..=11999, 12001..=16383]),
            ]
        );
    }
}

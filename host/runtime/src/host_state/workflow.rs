//! The `workflow` imports: groups a run opens, joins and seals, and graphs it declares, held until its ack.
//!
//! What they hold is charged to the run's [`Held`](super::Held) budget like a
//! follow-up's bytes. A graph's JSON is parsed within what the budget leaves
//! (`hourglass_task::graph::parse_nodes_within` counts every allocation
//! before making it), so no shape of text makes the host hold more.

use hourglass_task::graph::{GraphParseError, check, check_cost, parse_nodes_within};
use hourglass_task::group::{Callback, FireWhen, GroupId, GroupRef};
use hourglass_task::task::{GraphWork, GroupWork};
use hourglass_task::task_type::TaskType;

use super::{FOLLOWUP_OVERHEAD, HostState, MAX_FOLLOWUP_ID, MAX_FOLLOWUP_PAYLOAD, wit_workflow};

/// Groups one run may work on.
const MAX_GROUPS: usize = 100;
/// Graphs one run may declare.
const MAX_GRAPHS: usize = 10;

impl HostState {
    /// The run's work on group (`callback_type`, `group`), created on first use;
    /// the callback type must be granted.
    fn group_work(&mut self, callback_type: String, group: String) -> Result<&mut GroupWork, String> {
        if let Some(why) = &self.held.exceeded {
            return Err(why.clone());
        }
        let callback_type: TaskType = callback_type.parse().map_err(|e| format!("{e}"))?;
        let id: GroupId = group.parse().map_err(|e| format!("{e}"))?;
        let group = GroupRef { callback_type, id };
        let at = match self.groups.iter().position(|g| g.group == group) {
            Some(at) => at,
            None => {
                if self.groups.len() >= MAX_GROUPS {
                    return Err(format!("at most {MAX_GROUPS} groups per run"));
                }
                self.granted(&group.callback_type)?;
                self.held.charge(group.id.as_str().len() + FOLLOWUP_OVERHEAD, "groups", self.budget)?;
                self.groups.push(GroupWork { group, open: None, children: Vec::new(), seal: false });
                self.groups.len() - 1
            }
        };
        Ok(&mut self.groups[at])
    }
}

impl wit_workflow::Host for HostState {
    fn open(
        &mut self,
        callback_type: String,
        group: String,
        callback_id: String,
        callback_payload: String,
        when: wit_workflow::FireWhen,
    ) -> Result<(), String> {
        if callback_id.is_empty() || callback_id.len() > MAX_FOLLOWUP_ID {
            return Err(format!("callback id of {} bytes: it must be 1 to {MAX_FOLLOWUP_ID}", callback_id.len()));
        }
        if callback_payload.len() > MAX_FOLLOWUP_PAYLOAD / 2 {
            return Err(format!("callback payload of {} bytes is over the limit of 512 KiB", callback_payload.len()));
        }
        let replace = self.grants.check(&self.meta.task_type, &callback_type.parse().map_err(|e| format!("{e}"))?);
        let bytes = callback_id.len() + callback_payload.len();
        let budget = self.budget;
        self.held.charge(bytes, "groups", budget)?;
        let work = self.group_work(callback_type, group)?;
        let when = match when {
            wit_workflow::FireWhen::AllEnded => FireWhen::AllEnded,
            wit_workflow::FireWhen::AllSucceeded => FireWhen::AllSucceeded,
        };
        let callback = Callback { id: callback_id, payload: callback_payload, when, replace: replace.unwrap_or(false) };
        match &work.open {
            Some(open) if *open != callback => {
                Err(format!("group {} was opened with another callback in this run", work.group))
            }
            _ => {
                work.open = Some(callback);
                Ok(())
            }
        }
    }

    fn add(
        &mut self,
        callback_type: String,
        group: String,
        task_type: String,
        id: String,
        payload: Vec<u8>,
        due_ms: u64,
    ) -> Result<(), String> {
        if id.chars().any(char::is_control) {
            return Err("a group child's id may not contain control characters".into());
        }
        let child = self.followup(task_type, id.into_bytes(), payload, due_ms)?;
        let work = self.group_work(callback_type, group)?;
        if work.seal {
            return Err(format!("group {} was sealed in this run", work.group));
        }
        work.children.push(child);
        Ok(())
    }

    fn seal(&mut self, callback_type: String, group: String) -> Result<(), String> {
        self.group_work(callback_type, group)?.seal = true;
        Ok(())
    }

    fn graph(&mut self, home_type: String, graph: String, nodes_json: String) -> Result<(), String> {
        if let Some(why) = &self.held.exceeded {
            return Err(why.clone());
        }
        if self.graphs.len() >= MAX_GRAPHS {
            return Err(format!("at most {MAX_GRAPHS} graphs per run"));
        }
        let home: TaskType = home_type.parse().map_err(|e| format!("{e}"))?;
        let id: GroupId = graph.parse().map_err(|_| format!("invalid graph id {graph:?}: 1 to 200 bytes of text"))?;
        if self.graphs.iter().any(|g| g.home == home && g.id == id) {
            return Err(format!("graph {home}/{id} was declared in this run"));
        }
        let budget = self.budget;
        // While the text is parsed, serde_json's scratch buffer for an escaped
        // string (at most the text's length) is held beside what the parse builds.
        let scratch = nodes_json.len();
        self.held.fits(scratch, "graphs", budget)?;
        let (nodes, cost) = match parse_nodes_within(&nodes_json, &id, self.held.left() - scratch) {
            Ok(parsed) => parsed,
            Err(GraphParseError::OverBudget { wanted }) => {
                return Err(self.held.refuse(scratch.saturating_add(wanted), "graphs", budget));
            }
            Err(GraphParseError::Invalid(e)) => return Err(format!("graph {home}/{id}: {e:#}")),
        };
        drop(nodes_json);
        self.held.charge(cost.held + FOLLOWUP_OVERHEAD, "graphs", budget)?;
        self.held.fits(check_cost(&nodes), "graphs", budget)?;
        check(&id, &nodes)?;
        // The home type and every node's type must be granted, as a follow-up's would.
        self.granted(&home)?;
        let mut types: Vec<&TaskType> = nodes.iter().map(|n| &n.task_type).collect();
        types.sort();
        types.dedup();
        for t in types.into_iter().cloned().collect::<Vec<_>>() {
            self.granted(&t)?;
        }
        self.graphs.push(GraphWork { home, id, nodes });
        Ok(())
    }
}

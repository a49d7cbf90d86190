//! Containers the precreate hook got admitted, until the runtime shows them. podman runs no
//! poststop hook for a container whose runtime `create` failed after the hook (a command not
//! found in the image, say): its GPU share would stay on the agent's books until the agent
//! restarts. So a handle that has not started within the grace period is looked for in
//! runc's state (`[runtime_api] runc_roots`), and released if runc does not have it.
//!
//! The wrapper needs none of this: it sees runc's `create` fail and takes the container off
//! the books itself.
//!
//! The NRI path keeps one too ([`crate::node::Node::release_unconfirmed`]): CRI-O sends no
//! NRI event when the OCI runtime's `create` fails after NRI admitted the container.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Pending {
    grace: Duration,
    since: Mutex<HashMap<String, Instant>>,
}

impl Pending {
    pub fn new(grace: Duration) -> Pending {
        Pending {
            grace,
            since: Mutex::new(HashMap::new()),
        }
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// The agent admitted the hook's container `id` at `now`.
    pub fn admitted(&self, id: &str, now: Instant) {
        self.since
            .lock()
            .expect("pending lock")
            .insert(id.to_string(), now);
    }

    /// `id` started, was removed, or is in runc's state: nothing to watch any more.
    pub fn settled(&self, id: &str) {
        self.since.lock().expect("pending lock").remove(id);
    }

    /// Nothing to watch any more (the runtime's whole state was read).
    pub fn clear(&self) {
        self.since.lock().expect("pending lock").clear();
    }

    /// Whether anything is watched.
    pub fn is_empty(&self) -> bool {
        self.since.lock().expect("pending lock").is_empty()
    }

    /// The handles admitted more than the grace period before `now` and not settled since.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.due_after(now, self.grace)
    }

    /// The handles admitted more than `grace` before `now` and not settled since.
    pub fn due_after(&self, now: Instant, grace: Duration) -> Vec<String> {
        let mut due: Vec<String> = self
            .since
            .lock()
            .expect("pending lock")
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= grace)
            .map(|(id, _)| id.clone())
            .collect();
        due.sort();
        due
    }

    /// Of the `due` handles, those runc does not have (`present`: the registry ids of what
    /// it lists) — to release; the others are settled.
    pub fn unclaimed(&self, due: &[String], present: &HashSet<String>) -> Vec<String> {
        due.iter()
            .filter(|id| {
                if present.contains(*id) {
                    self.settled(id);
                    false
                } else {
                    true
                }
            })
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_due_after_the_grace_unless_settled() {
        let p = Pending::new(Duration::from_secs(60));
        let t0 = Instant::now();
        p.admitted("hook-a", t0);
        p.admitted("hook-b", t0 + Duration::from_secs(30));
        p.admitted("hook-c", t0);
        p.settled("hook-c");
        assert!(p.due(t0 + Duration::from_secs(59)).is_empty());
        assert_eq!(p.due(t0 + Duration::from_secs(60)), vec!["hook-a"]);
        assert_eq!(
            p.due(t0 + Duration::from_secs(90)),
            vec!["hook-a", "hook-b"]
        );
        assert!(
            p.due(t0).is_empty(),
            "a clock before the admission: not due"
        );
    }

    #[test]
    fn runc_has_it_or_it_is_released() {
        let p = Pending::new(Duration::ZERO);
        let t0 = Instant::now();
        p.admitted("hook-a", t0);
        p.admitted("hook-b", t0);
        let due = p.due(t0);
        let present: HashSet<String> = ["hook-b".to_string()].into();
        assert_eq!(p.unclaimed(&due, &present), vec!["hook-a"]);
        assert_eq!(p.due(t0), vec!["hook-a"], "hook-b is settled");
        p.settled("hook-a");
        assert!(p.due(t0).is_empty());
    }
}

//! Doubling waits between a minimum and a maximum, for every reconnect loop we run (the NRI
//! runtime connection, kubelet registration, the node annotation's API-server writes).

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The wait to use now; the next one is twice as long, up to `max`.
    pub fn next_wait(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to `min` (after a success).
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
        let waits: Vec<u64> = (0..5).map(|_| b.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [200, 400, 800, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_wait(), Duration::from_millis(200));
    }
}

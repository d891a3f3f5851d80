//! The balancer as a test holds it: started in the lab's balancer namespace, read through its log.
//!
//! ```text
//! Lab::start_balancer(config) ─► `switchyard-lab balance …` in <id>-balancer (supervised, stdout logged)
//!   ─► waits for {"event":"ready"} ─► Balancer
//! Balancer::log()        ─► BalancerLog (every event so far)
//! Balancer::wait_for(…)  ─► polls the log until a question has an answer
//! ```

use std::time::{Duration, Instant};

use super::{BalancerConfig, BalancerLog};
use crate::error::{LabError, Result};
use crate::{ChildHandle, Lab, Place};

/// How long the balancer gets to check every node once and listen.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a wait reads the log again.
const POLL: Duration = Duration::from_millis(20);

/// A running balancer.
#[derive(Debug)]
pub struct Balancer {
    child: ChildHandle,
    config: BalancerConfig,
}

impl Lab {
    /// Starts the outside load balancer in the lab's balancer namespace (a lab built with
    /// `LabOptions::balancer_ip`) and waits until it has checked every node once and listens.
    pub fn start_balancer(&self, config: &BalancerConfig) -> Result<Balancer> {
        let argv = config.argv(&self.options().lab_binary);
        let child = self.spawn_in(&Place::Balancer, &argv)?;
        child.wait_for_output("{\"event\":\"ready\"", READY_TIMEOUT)?;
        Ok(Balancer {
            child,
            config: config.clone(),
        })
    }
}

impl Balancer {
    /// What it was started with.
    pub fn config(&self) -> &BalancerConfig {
        &self.config
    }

    /// Its process (logs, liveness).
    pub fn child(&self) -> &ChildHandle {
        &self.child
    }

    /// Every event it logged so far.
    pub fn log(&self) -> Result<BalancerLog> {
        BalancerLog::parse(&self.child.stdout())
    }

    /// Reads the log until `answer` returns something, for at most `timeout`; `what` names the wait
    /// in the error.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        answer: impl Fn(&BalancerLog) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = answer(&self.log()?) {
                return Ok(found);
            }
            if !self.child.is_running() {
                return Err(LabError::ExitedEarly {
                    what: format!("the balancer (waiting for {what})"),
                    status: "exited".into(),
                    stderr: self.child.stderr(),
                });
            }
            if Instant::now() >= deadline {
                return Err(LabError::Timeout {
                    what: format!("the balancer's log to show {what}"),
                    waited_ms: timeout.as_millis(),
                });
            }
            std::thread::sleep(POLL);
        }
    }
}

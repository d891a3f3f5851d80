//! The tracer as this backend loads it: the toolkit's [`Tracer`] with this backend's jump rules, and
//! with a rendered [`Ruleset`] restored.
//!
//! ```text
//! jump_rules(family) ─► Tracer::with_jumps ─► Tracer::new
//! Ruleset ─► full_payload() ─► Tracer::new(..).restore() ─► Tracer::from_ruleset
//! ```

use std::net::IpAddr;

use switchyard_api::IpFamily;

use super::render::jump_rules;
use super::ruleset::Ruleset;
use crate::error::Error;
use crate::xtables::Tracer;

impl Tracer {
    /// Built-in chains holding the iptables backend's jump rules (prepended in [`jump_rules`] order,
    /// as the edge does), and nothing else. `local_addrs` are the node's addresses
    /// (`--src-type`/`--dst-type LOCAL`); loopback addresses are always local.
    pub fn new(family: IpFamily, local_addrs: &[IpAddr]) -> Result<Self, Error> {
        Self::with_jumps(family, local_addrs, &jump_rules(family))
    }

    /// [`Tracer::new`] with `ruleset`'s full payload restored.
    pub fn from_ruleset(ruleset: &Ruleset, local_addrs: &[IpAddr]) -> Result<Self, Error> {
        let mut tracer = Self::new(ruleset.family(), local_addrs)?;
        tracer.restore(&ruleset.full_payload())?;
        Ok(tracer)
    }
}

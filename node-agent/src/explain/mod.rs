//! `switchyard-agent explain`: the path a new connection takes on this node, in words.
//!
//! ```text
//! plan (file) ─► entry whose frontend is the destination ─► words: frontend, source, source ranges,
//!   │                                                        policy and topology, affinity
//!   └► render (iptables rules of the plan) ─► Tracer ─► trace(packet) ─► endpoints + probabilities,
//!                                                                         masquerade, REJECT/DROP
//! --kernel (read by wiring::explain): kernel::{iptables, nftables, ipvs} compare what the kernel holds
//!   on this path (iptables-save ─► Tracer ─► trace; elements and chains; virtual and real servers)
//!   ─► drift, and the kernel's outcome where it has one
//! ```
//!
//! Split by job: [`question`] parses and resolves the question, [`verdict`] decides the answer,
//! [`words`] holds the answer and says it, [`kernel`] compares the kernel with it per backend.
//!
//! The verdict comes from the same render the agent programs and the same packet model the tests use
//! (kube-proxy semantics whatever the backend; IPVS spreads by weight, which the words add), so the
//! explanation cannot disagree with what the plan makes the node do. Everything but reading the kernel
//! is pure: [`explain`] takes the plan and the question and returns an [`Explanation`].

pub mod kernel;
pub mod question;
pub mod verdict;
pub mod words;

pub use question::{Destination, Source};
pub use verdict::{explain, plan_tracer};
pub use words::{Candidate, EXIT_FORWARDED, EXIT_NOT_FORWARDED, Explanation, Outcome};

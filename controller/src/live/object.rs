//! Which of our objects: a node's plan or a ForwardingSlice, by name. What the queue orders, the
//! writer writes and the logs name.
//!
//! ```text
//! ObjectRef::Plan(node) ─► NodeForwardingPlan <node>      ObjectRef::Slice(name) ─► ForwardingSlice <name>
//! ```

/// One object the controller writes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectRef {
    /// A ForwardingSlice, by name.
    Slice(String),
    /// A node's NodeForwardingPlan, by node (= object) name.
    Plan(String),
}

impl ObjectRef {
    /// The object's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Slice(_) => "ForwardingSlice",
            Self::Plan(_) => "NodeForwardingPlan",
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Slice(name) | Self::Plan(name) => name,
        }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind(), self.name())
    }
}

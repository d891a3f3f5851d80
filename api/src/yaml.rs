//! YAML reading options shared by every reader of plans and cluster dumps.
//!
//! serde-saphyr's default resource budget stops at 250,000 nodes, which a 2,000-service plan or cluster
//! dump already exceeds; YAML 1.1 booleans (`yes`, `on`) would turn label values into booleans. Readers of
//! large, machine-written files use these options instead.

/// Strict booleans and a budget sized for plans and dumps of tens of thousands of Services (1 GiB input).
pub fn large_file_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = usize::MAX / 2;
    budget.max_nodes = usize::MAX / 2;
    budget.max_total_scalar_bytes = 1 << 30;
    budget.max_reader_input_bytes = Some(1 << 30);
    options.budget = Some(budget);
    options
}

//! YAML reading options shared by every reader of plans and cluster dumps, and what to tell a user
//! whose file exceeds them.
//!
//! ```text
//! file ─► serde-saphyr with large_file_options() ─► documents
//!                              └─ a limit exceeded ─► exceeded_limit(&error) ─► one plain sentence
//! ```
//!
//! serde-saphyr's defaults suit configuration files: 1,024 documents, 250,000 nodes, 256 MiB. A
//! `kubectl get -o yaml` dump of a large cluster, a concatenated GitOps tree or a 10,000-Service plan
//! passes several of them, and YAML 1.1 booleans (`yes`, `on`) would turn label values into booleans.
//! The limits below are chosen for those files instead; each still stops a hostile input early.

use serde_saphyr::budget::BudgetBreach;

/// Most bytes one file may hold: a 10,000-Service plan is ~5 MB as YAML, a dump of 20,000 objects a
/// few hundred MB at most.
pub const MAX_INPUT_BYTES: usize = 1 << 30;
/// Most documents (`---`-separated) in one file: a dump or GitOps tree of 20,000 objects fits five
/// times over, while a separator storm still stops.
pub const MAX_DOCUMENTS: usize = 100_000;
/// Deepest nesting of maps and lists: Kubernetes objects nest about 10 levels; the bound keeps the
/// parser's stack and time small.
pub const MAX_DEPTH: usize = 64;

/// Strict booleans and the limits above. Nodes, events and scalar bytes are bounded by the input size
/// (every node costs at least one byte of input), so they are set to it rather than to a second,
/// smaller number that a legitimate large file could hit first.
pub fn large_file_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    let mut budget = serde_saphyr::Budget::default();
    budget.max_reader_input_bytes = Some(MAX_INPUT_BYTES);
    budget.max_total_scalar_bytes = MAX_INPUT_BYTES;
    budget.max_events = MAX_INPUT_BYTES;
    budget.max_nodes = MAX_INPUT_BYTES;
    budget.max_documents = MAX_DOCUMENTS;
    budget.max_depth = MAX_DEPTH;
    options.budget = Some(budget);
    options
}

/// When `error` is a limit of [`large_file_options`] being exceeded, the limit in plain words (the
/// parser's own message is a debug dump of its budget).
pub fn exceeded_limit(error: &serde_saphyr::Error) -> Option<String> {
    let serde_saphyr::Error::Budget { breach, .. } = error.without_snippet() else {
        return None;
    };
    Some(match breach {
        BudgetBreach::Documents { .. } => format!(
            "the file holds more than {MAX_DOCUMENTS} YAML documents, the most one file may hold: split it"
        ),
        BudgetBreach::Depth { .. } => {
            format!("maps and lists nest more than {MAX_DEPTH} levels deep, which no Kubernetes object does")
        }
        BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. } | BudgetBreach::ScalarBytes { .. } => {
            format!("the file is larger than {MAX_INPUT_BYTES} bytes, the most one file may hold: split it")
        }
        BudgetBreach::Aliases { .. }
        | BudgetBreach::Anchors { .. }
        | BudgetBreach::AliasAnchorRatio { .. }
        | BudgetBreach::MergeKeys { .. } => {
            "the file uses more YAML anchors, aliases or merge keys than a machine-written file has \
             (an alias bomb?)"
                .to_string()
        }
        other => format!("the file exceeds a YAML parser limit ({other:?})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<serde_json::Value>, serde_saphyr::Error> {
        serde_saphyr::from_multiple_with_options(text, large_file_options())
    }

    #[test]
    fn twenty_thousand_documents_parse() {
        let text = "kind: ConfigMap\nmetadata: {name: x}\n---\n".repeat(20_000);
        assert_eq!(parse(&text).unwrap().len(), 20_000);
    }

    #[test]
    fn exceeded_limits_are_said_in_plain_words() {
        let too_many = "a: 1\n---\n".repeat(MAX_DOCUMENTS + 1);
        let too_deep = format!("{}1{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        for (text, want) in [
            (too_many, "more than 100000 YAML documents"),
            (too_deep, "nest more than 64 levels deep"),
        ] {
            let error = parse(&text).unwrap_err();
            let said = exceeded_limit(&error).unwrap_or_else(|| panic!("not a limit: {error}"));
            assert!(said.contains(want), "{said}");
        }
        let syntax = parse("a: [unclosed\n").unwrap_err();
        assert_eq!(exceeded_limit(&syntax), None);
    }
}

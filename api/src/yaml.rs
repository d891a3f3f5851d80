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
//! The limits below are chosen for those files instead; each still stops a hostile input early. Aliases
//! are the exception the other way: every other limit grows with the input, but a few hundred bytes of
//! nested aliases (an alias bomb) expand to the parser's default of a million replayed events, seconds of
//! CPU for every reading of one small file; machine-written files have no aliases at all.

use serde_saphyr::budget::BudgetBreach;

/// Most bytes one file may hold: a 10,000-Service plan is ~5 MB as YAML, a dump of 20,000 objects a
/// few hundred MB at most.
pub const MAX_INPUT_BYTES: usize = 1 << 30;
/// Most documents (`---`-separated) in one file: a dump or GitOps tree of 20,000 objects fits five
/// times over, while a separator storm still stops.
pub const MAX_DOCUMENTS: usize = 100_000;
/// Most bytes one plan file (a node's plan, or its plan and its views' slices) may hold, checked before
/// it is read: a 10,000-Service plan is ~5 MB, so [`crate::validate::MAX_ENTRIES`] entries of that size
/// fit; a 200,000-entry plan of the same entries does not, and is refused without being parsed.
pub const MAX_PLAN_BYTES: usize = 64 << 20;
/// Deepest nesting of maps and lists: Kubernetes objects nest about 10 levels; the bound keeps the
/// parser's stack and time small.
pub const MAX_DEPTH: usize = 64;
/// Most events all aliases of one file may expand to: a hand-written file reusing a port list or a
/// label map through anchors stays far below it; an alias bomb stops after a few milliseconds.
pub const MAX_ALIAS_EVENTS: usize = 10_000;

/// Strict booleans and the limits above. Nodes, events and scalar bytes are bounded by the input size
/// (every node costs at least one byte of input), so they are set to it rather than to a second,
/// smaller number that a legitimate large file could hit first.
pub fn large_file_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    // A key given twice is an error (the default, pinned): a second value must not silently win.
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    let mut budget = serde_saphyr::Budget::default();
    budget.max_reader_input_bytes = Some(MAX_INPUT_BYTES);
    budget.max_total_scalar_bytes = MAX_INPUT_BYTES;
    budget.max_events = MAX_INPUT_BYTES;
    budget.max_nodes = MAX_INPUT_BYTES;
    budget.max_documents = MAX_DOCUMENTS;
    budget.max_depth = MAX_DEPTH;
    options.budget = Some(budget);
    options.alias_limits.max_total_replayed_events = MAX_ALIAS_EVENTS;
    options
}

/// When `error` is a limit of [`large_file_options`] being exceeded, the limit in plain words (the
/// parser's own message is a debug dump of its budget).
pub fn exceeded_limit(error: &serde_saphyr::Error) -> Option<String> {
    let mut error = error;
    // The limit may be wrapped in a snippet of the file or the alias it was reached through.
    while let serde_saphyr::Error::WithSnippet { error: inner, .. }
    | serde_saphyr::Error::AliasError { error: inner, .. } = error
    {
        error = inner;
    }
    if let serde_saphyr::Error::AliasReplayLimitExceeded { .. } = error {
        return Some(format!(
            "the file's YAML aliases expand to more than {MAX_ALIAS_EVENTS} nodes, which no machine-written \
             file does (an alias bomb?)"
        ));
    }
    let serde_saphyr::Error::Budget { breach, .. } = error else {
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
        | BudgetBreach::RecordedAnchorEvents { .. }
        | BudgetBreach::RecordedAnchorBytes { .. }
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
        let duplicate = parse("port: 80\nport: 81\n").unwrap_err().to_string();
        assert!(duplicate.contains("duplicate mapping key: port"), "{duplicate}");
        let syntax = parse("a: [unclosed\n").unwrap_err();
        assert_eq!(exceeded_limit(&syntax), None);
    }

    /// Found by the plan file fuzzer (fuzz/corpus/plan_file/found-c86e58e7411242f9): eleven levels of nine
    /// aliases each took the parser's default budget of a million replayed events, 10-20 s per reading
    /// in a debug build (the agent read such a plan three times). Five levels (9^5 = 59,049 events) are
    /// far below the parser's default budget, so only our limit refuses them: no clock needed.
    #[test]
    fn an_alias_bomb_stops_early_and_says_so() {
        let mut bomb = String::from("a: [&a0 [x, x, x, x, x, x, x, x, x]");
        for level in 1..5 {
            bomb.push_str(&format!(
                ", &a{level} [{}]",
                vec![format!("*a{}", level - 1); 9].join(", ")
            ));
        }
        bomb.push_str("]\n");
        let error = parse(&bomb).unwrap_err();
        let said = exceeded_limit(&error).unwrap_or_else(|| panic!("not a limit: {error}"));
        assert!(said.contains("aliases expand to more than 10000 nodes"), "{said}");
        let reused = "ports: &ports [{port: 80}, {port: 443}]\na: *ports\nb: *ports\n";
        assert_eq!(parse(reused).unwrap()[0]["b"][1]["port"], 443);
    }
}

//! The tokens of `iptables-restore` / `iptables-save` text, and the built-in chains of the tables we use:
//! the one tokenizer, quoter and chain list every reader and writer of that text shares (the save
//! parser, the tracer, the IPVS glue and the in-memory iptables).
//!
//! ```text
//! "-m comment --comment \"a \\\"b\\\"\" -j X" ─► tokenize ─► ["-m", "comment", "--comment", "a \"b\"", "-j", "X"]
//! ["--comment", "a b"] ─► quote_args ─► "--comment \"a b\""      (tokenize(quote_args(args)) == args)
//! ```

use super::payload::Table;

/// The built-in chains of `table` in the kernel (nat has no FORWARD).
pub fn built_in_chains(table: Table) -> &'static [&'static str] {
    match table {
        Table::Filter => &["INPUT", "FORWARD", "OUTPUT"],
        Table::Nat => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
    }
}

/// Whether `chain` is one of `table`'s built-in chains.
pub fn is_built_in(table: Table, chain: &str) -> bool {
    built_in_chains(table).contains(&chain)
}

/// Splits a rule into arguments as `iptables-restore` does: a double-quoted string is one argument,
/// and `\"` and `\\` inside quotes stand for `"` and `\` (`iptables-save` escapes them that way). An
/// unterminated quote is an error.
pub fn tokenize(text: &str) -> Result<Vec<String>, String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut started = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_quotes => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            '"' => {
                in_quotes = !in_quotes;
                started = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if started {
                    tokens.push(std::mem::take(&mut current));
                    started = false;
                }
            }
            c => {
                current.push(c);
                started = true;
            }
        }
    }
    if in_quotes {
        return Err(format!("unterminated quote in {text:?}"));
    }
    if started {
        tokens.push(current);
    }
    Ok(tokens)
}

/// The restore-text form of an argument vector: arguments that are empty or hold whitespace, `"` or
/// `\` are double-quoted, with `"` and `\` escaped, so [`tokenize`] gives the vector back.
pub fn quote_args(args: &[String]) -> String {
    let mut out = String::new();
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let plain = !arg.is_empty() && !arg.chars().any(|c| c.is_whitespace() || c == '"' || c == '\\');
        if plain {
            out.push_str(arg);
        } else {
            out.push('"');
            for c in arg.chars() {
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        }
    }
    out
}

/// `arg` as a POSIX shell word: bare when it is safe, single-quoted otherwise (the render commands
/// print rules and commands to paste into a shell).
pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c))
    {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_unquotes_like_iptables_save() {
        let cases: [(&str, &[&str]); 4] = [
            (
                r#"-m comment --comment "a \"b\" c" -j X"#,
                &["-m", "comment", "--comment", "a \"b\" c", "-j", "X"],
            ),
            ("  -j   X  ", &["-j", "X"]),
            (r#"--comment """#, &["--comment", ""]),
            (r#"--comment "a\\b""#, &["--comment", r"a\b"]),
        ];
        for (text, want) in cases {
            assert_eq!(tokenize(text).unwrap(), want, "{text}");
        }
        assert!(tokenize("\"open").is_err());
    }

    #[test]
    fn quoting_round_trips_through_the_tokenizer() {
        let args: Vec<String> = [
            "-m",
            "comment",
            "--comment",
            "ns/a:p cluster IP",
            "",
            r#"say "hi"\"#,
            "-j",
            "X",
        ]
        .map(String::from)
        .to_vec();
        let text = quote_args(&args);
        assert_eq!(
            text,
            r#"-m comment --comment "ns/a:p cluster IP" "" "say \"hi\"\\" -j X"#
        );
        assert_eq!(tokenize(&text).unwrap(), args);
    }

    #[test]
    fn nat_has_no_forward_chain() {
        assert!(is_built_in(Table::Filter, "FORWARD"));
        assert!(!is_built_in(Table::Nat, "FORWARD"));
        assert!(is_built_in(Table::Nat, "PREROUTING"));
        assert!(!is_built_in(Table::Filter, "SWYD-SERVICES"));
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_quote("SWYD-SERVICES"), "SWYD-SERVICES");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}

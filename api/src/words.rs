//! What a reader of plans, slices and cluster dumps tells its user when a value does not fit: in the
//! object's own terms (the field path, the allowed range), never the parser's (`invalid u16`, `set
//! DuplicateKeyPolicy in Options if acceptable`, `expected i32`).
//!
//! ```text
//! JSON text / serde_json::Value ─► serde_path_to_error ─► "spec.ports[0].port: " + plain(serde's message)
//! YAML text ─► serde-saphyr ─► yaml(&error): a limit ─► yaml::exceeded_limit
//!                                            else    ─► rendered with [`Words`] (line, column, snippet kept)
//! ```

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde_saphyr::{MessageFormatter, UserMessageFormatter};

/// What a Rust number type holds, in words.
fn range_of(ty: &str) -> Option<&'static str> {
    Some(match ty {
        "u8" => "a whole number from 0 to 255",
        "u16" => "a whole number from 0 to 65535",
        "u32" => "a whole number from 0 to 4294967295",
        "u64" | "usize" => "a whole number from 0 up",
        "i8" => "a whole number from -128 to 127",
        "i16" => "a whole number from -32768 to 32767",
        "i32" => "a whole number from -2147483648 to 2147483647",
        "i64" | "isize" => "a whole number",
        "f32" | "f64" => "a number",
        "bool" | "a boolean" => "true or false",
        _ => return None,
    })
}

/// serde's `invalid value: integer `70000`, expected u16` and `invalid type: string "abc", expected
/// i32` (and serde_json's ` at line L column C` after them) in words; other messages unchanged.
pub fn plain(message: &str) -> String {
    for (prefix, says) in [
        ("invalid value: ", "is out of range"),
        ("invalid type: ", "is the wrong kind of value"),
    ] {
        let Some(rest) = message.strip_prefix(prefix) else {
            continue;
        };
        let Some((found, expected)) = rest.rsplit_once(", expected ") else {
            continue;
        };
        let (expected, at) = match expected.find(" at line ") {
            Some(i) => expected.split_at(i),
            None => (expected, ""),
        };
        let Some(range) = range_of(expected) else {
            continue;
        };
        // `integer `70000``, `string "abc"`: the value as written.
        let value = found
            .split_once(' ')
            .map_or(found, |(_, value)| value)
            .trim_matches('`');
        return format!("{value} {says}: it must be {range}{at}");
    }
    message.to_string()
}

/// Deserialises `value`, naming the field that does not fit: `spec.ports[0].port: "abc" is the wrong
/// kind of value: it must be a whole number from -2147483648 to 2147483647`.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| with_path(e.path(), e.inner()))
}

/// [`from_value`] for JSON text.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut reader).map_err(|e| with_path(e.path(), e.inner()))?;
    reader.end().map_err(|e| plain(&e.to_string()))?;
    Ok(value)
}

fn with_path(path: &serde_path_to_error::Path, error: &serde_json::Error) -> String {
    let message = plain(&error.to_string());
    match path.to_string().as_str() {
        "." => message,
        path => format!("{path}: {message}"),
    }
}

/// A YAML reading failure in words: the limit it exceeded, or the parser's location and snippet with
/// the message said by [`Words`].
pub fn yaml(error: &serde_saphyr::Error) -> String {
    crate::yaml::exceeded_limit(error).unwrap_or_else(|| error.render_with_formatter(&Words))
}

/// serde-saphyr's user-facing messages, with ranges for numbers and a plain sentence for a key given
/// twice.
pub struct Words;

impl MessageFormatter for Words {
    fn format_message<'a>(&self, error: &'a serde_saphyr::Error) -> Cow<'a, str> {
        match error {
            serde_saphyr::Error::InvalidScalar { ty, .. } => match range_of(ty) {
                Some(range) => Cow::Owned(format!("this value does not fit: it must be {range}")),
                None => UserMessageFormatter.format_message(error),
            },
            serde_saphyr::Error::DuplicateMappingKey { key: Some(key), .. } => Cow::Owned(format!(
                "`{key}` is given twice in one mapping: each key may appear once (which one was meant?)"
            )),
            serde_saphyr::Error::DuplicateMappingKey { key: None, .. } => {
                Cow::Borrowed("a key is given twice in one mapping: each key may appear once")
            }
            serde_saphyr::Error::SerdeInvalidType {
                unexpected, expected, ..
            } => Cow::Owned(plain(&format!("invalid type: {unexpected}, expected {expected}"))),
            serde_saphyr::Error::SerdeInvalidValue {
                unexpected, expected, ..
            } => Cow::Owned(plain(&format!(
                "invalid value: {unexpected}, expected {expected}"
            ))),
            serde_saphyr::Error::Message { msg, .. } => Cow::Owned(plain(msg)),
            _ => UserMessageFormatter.format_message(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Port {
        port: u16,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Spec {
        ports: Vec<Port>,
    }

    #[test]
    fn serde_messages_become_ranges() {
        let cases = [
            (
                "invalid value: integer `70000`, expected u16",
                "70000 is out of range: it must be a whole number from 0 to 65535",
            ),
            (
                "invalid type: string \"abc\", expected i32 at line 3 column 9",
                "\"abc\" is the wrong kind of value: it must be a whole number from -2147483648 to 2147483647 at line 3 column 9",
            ),
            ("missing field `port`", "missing field `port`"),
            (
                "invalid type: map, expected a string",
                "invalid type: map, expected a string",
            ),
        ];
        for (serde, ours) in cases {
            assert_eq!(plain(serde), ours, "{serde}");
        }
    }

    #[test]
    fn json_errors_name_the_field() {
        let error = from_json::<Spec>(r#"{"ports": [{"port": 80}, {"port": 70000}]}"#).unwrap_err();
        assert!(
            error.starts_with(
                "ports[1].port: 70000 is out of range: it must be a whole number from 0 to 65535"
            ),
            "{error}"
        );
        let error = from_value::<Spec>(serde_json::json!({"ports": [{"port": "abc"}]})).unwrap_err();
        assert_eq!(
            error,
            "ports[0].port: \"abc\" is the wrong kind of value: it must be a whole number from 0 to 65535"
        );
        assert!(
            from_json::<Spec>(r#"{"ports": []} x"#)
                .unwrap_err()
                .contains("trailing characters")
        );
    }

    #[test]
    fn yaml_errors_keep_the_location_and_drop_the_library_words() {
        let options = crate::yaml::large_file_options;
        let error =
            serde_saphyr::from_str_with_options::<Spec>("ports:\n- port: 70000\n", options()).unwrap_err();
        let text = yaml(&error);
        assert!(text.contains("line 2"), "{text}");
        assert!(
            text.contains("it must be a whole number from 0 to 65535"),
            "{text}"
        );
        assert!(!text.contains("invalid u16"), "{text}");

        let error =
            serde_saphyr::from_str_with_options::<Spec>("ports: []\nports: []\n", options()).unwrap_err();
        let text = yaml(&error);
        assert!(text.contains("`ports` is given twice in one mapping"), "{text}");
        assert!(!text.contains("DuplicateKeyPolicy"), "{text}");
    }
}

//! Lists that stop deserialising at their limit: a plan file of 200,000 entries is refused when the
//! 100,001st entry is read, not after every entry was allocated and validation counted them.
//!
//! ```text
//! #[serde(deserialize_with = "crate::bounded::entries")] services ─► next_element() … MAX_ENTRIES ─► one more ─► error
//!                                                                    (the parser adds where: line and column)
//! ```
//!
//! Used on the lists whose length only validation would bound otherwise (entries, `endpointsOnNode`,
//! `localEndpoints`). The error fails the whole object, as an over-long list fails validation of the
//! whole object anyway. Everything else about the list reads as a plain `Vec` would. [`MAX_ENTRIES`]
//! is defined here, below the types that read through it (`plan`, `slice`), and [`crate::validate`]
//! re-exports it with its other limits.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};

/// Most entries one plan, slice or composed view may carry: ten times the 10,000-Service design scale.
pub const MAX_ENTRIES: usize = 100_000;

/// Most elements preallocated from a size hint (a hostile hint must not reserve gigabytes).
const MAX_PREALLOCATED: usize = 4096;

/// The end of every message of a list past its limit.
const EXCEEDED: &str = "the most one object may hold";

/// True when a parser's message says a bounded list was past its limit: a reader that would try the
/// text again in another shape stops here (every shape would stop at the same list).
pub fn exceeded(message: &str) -> bool {
    message.contains(EXCEEDED)
}

struct Bounded<T> {
    max: usize,
    what: &'static str,
    element: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of at most {} {}", self.max, self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let hint = seq.size_hint().unwrap_or(0);
        let mut out = Vec::with_capacity(hint.min(self.max).min(MAX_PREALLOCATED));
        while let Some(element) = seq.next_element()? {
            if out.len() == self.max {
                return Err(A::Error::custom(format_args!(
                    "more than {} {}, {EXCEEDED}",
                    self.max, self.what
                )));
            }
            out.push(element);
        }
        Ok(out)
    }
}

fn bounded<'de, D, T>(deserializer: D, max: usize, what: &'static str) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_seq(Bounded {
        max,
        what,
        element: PhantomData,
    })
}

/// A list of Service entries: at most [`MAX_ENTRIES`].
pub fn entries<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    bounded(deserializer, MAX_ENTRIES, "entries")
}

/// A list of addresses over a whole plan (`endpointsOnNode`): at most [`MAX_ENTRIES`].
pub fn addresses<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    bounded(deserializer, MAX_ENTRIES, "addresses")
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct Holder {
        #[serde(default, deserialize_with = "super::entries")]
        items: Vec<u8>,
    }

    #[test]
    fn a_list_past_its_limit_stops_at_the_first_element_too_many() {
        let fits = format!("{{\"items\": [{}0]}}", "0,".repeat(super::MAX_ENTRIES - 1));
        let holder: Holder = serde_json::from_str(&fits).unwrap();
        assert_eq!(holder.items.len(), super::MAX_ENTRIES);
        let over = format!("{{\"items\": [{}0]}}", "0,".repeat(super::MAX_ENTRIES));
        let error = serde_json::from_str::<Holder>(&over).unwrap_err().to_string();
        assert!(
            error.contains("more than 100000 entries, the most one object may hold"),
            "{error}"
        );
        assert!(super::exceeded(&error));
        let yaml: Holder = serde_saphyr::from_str("items: [1, 2]\n").unwrap();
        assert_eq!(yaml.items, [1, 2]);
        let missing: Holder = serde_json::from_str("{}").unwrap();
        assert!(missing.items.is_empty());
    }
}

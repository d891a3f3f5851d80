//! The fuzz harness of the fuzz test targets (`controller/tests/fuzz.rs`, `node-agent/tests/fuzz.rs`,
//! which include this file with `#[path]`): corpus seeds and proptest-made inputs into a parser's real
//! entry point, which must return (Ok or Err, either will do) and never panic.
//!
//! ```text
//! fuzz/corpus/<target>/* ─► seeds ─┬─► each fed as it is (the regression seeds)
//!                                  └─► proptest: (seed, [Mutation]) ─► mutate() ──┐
//! proptest: arbitrary bytes, text, YAML token soup, netlink attribute soup ───────┼─► target entry point
//!                                                                                 │
//!         panic, or slower than SLOW ─► shrunk by proptest ─► fuzz/corpus/<target>/found-<hash>, test fails
//! ```
//!
//! Mutations are structure-aware where it pays: besides flipping, inserting and deleting bytes they splice
//! lines of one seed into another, repeat lines (duplicate keys, entry floods), replace scalars with extreme
//! values (huge and negative numbers, empty and 20,000-character strings, odd IPs and CIDRs, YAML tags,
//! aliases), nest flow and block collections thousands deep, add alias bombs, and set length and type
//! fields of binary messages to boundary values.
//!
//! Budget: by default a fixed number of cases ([`DEFAULT_CASES`]) from a fixed seed, a few seconds, the
//! same on every run. `SWITCHYARD_FUZZ_SECONDS=N` runs batches from fresh random seeds until N seconds are
//! spent (`make fuzz`); `SWITCHYARD_FUZZ_CASES=N` sets the fixed count; `SWITCHYARD_FUZZ_SEED=N` the first
//! seed (every batch prints its seed, to repeat a run that aborted: a stack overflow is not a panic, and
//! no `catch_unwind` survives it).

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

/// Cases per target in a plain `cargo test` (half mutated seeds, the rest arbitrary input).
pub const DEFAULT_CASES: u32 = 256;
/// Cases per proptest run when running for a time budget.
const BATCH: u32 = 64;
/// An input taking longer than this is a finding too (a parser that hangs is as bad as one that panics).
const SLOW: Duration = Duration::from_secs(20);
/// Mutated inputs are cut at this size.
const MAX_LEN: usize = 2 << 20;

/// A parser's entry point.
#[derive(Clone, Copy)]
pub enum Entry {
    /// Reads text (inputs that are not UTF-8 are fed lossily converted: the real readers refuse them
    /// before parsing).
    Text(fn(&str)),
    /// Reads bytes (netlink messages).
    #[allow(dead_code)] // the controller's targets all read text
    Bytes(fn(&[u8])),
}

/// One fuzz target.
pub struct Target {
    /// Its corpus directory: `fuzz/corpus/<name>/`.
    pub name: &'static str,
    /// What it feeds.
    pub entry: Entry,
}

/// Feeds the corpus, then mutated and arbitrary inputs, to `target`; fails on a panic or a slow input,
/// saving the (shrunk) input into the corpus first.
pub fn fuzz(target: &Target) {
    let started = Instant::now();
    let seeds = corpus(target);
    assert!(
        !seeds.is_empty(),
        "fuzz {}: no seeds in {}",
        target.name,
        corpus_dir(target.name).display()
    );
    for seed in &seeds {
        if let Err(why) = feed(target, &seed.bytes) {
            panic!("fuzz {}: corpus seed {}: {why}", target.name, seed.name);
        }
    }
    let tokens = tokens(&seeds);
    let strategy = prop_oneof![
        1 => arbitrary(target.entry, tokens).prop_map(Case::Arbitrary),
        1 => (any::<Index>(), vec(mutation(), 1..6)).prop_map(|(seed, steps)| Case::Mutated(seed, steps)),
    ];
    let seconds: Option<u64> = env_number("SWITCHYARD_FUZZ_SECONDS");
    let mut seed = env_number("SWITCHYARD_FUZZ_SEED").unwrap_or(match seconds {
        Some(_) => fresh_seed(),
        None => 0x5157_7964, // fixed: a plain test run is the same every time
    });
    let (deadline, batch) = match seconds {
        Some(s) => (Some(started + Duration::from_secs(s)), BATCH),
        None => (None, env_number("SWITCHYARD_FUZZ_CASES").unwrap_or(DEFAULT_CASES)),
    };
    let mut cases = 0u64;
    loop {
        if deadline.is_some() {
            eprintln!("fuzz {}: batch seed {seed}", target.name);
        }
        let config = Config {
            cases: batch,
            failure_persistence: None,
            max_shrink_time: 120_000,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed));
        let mut runner = TestRunner::new_with_rng(config, rng);
        let result = runner.run(&strategy, |case| {
            feed(target, &case.bytes(&seeds)).map_err(TestCaseError::fail)
        });
        cases += u64::from(batch);
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, case)) => {
                let bytes = case.bytes(&seeds);
                let saved = save(target, &bytes);
                panic!(
                    "fuzz {}: {why}\nminimal input (batch seed {seed}) saved as {}, which every run now feeds \
                     first: fix the parser and keep the file. The case: {case:?}",
                    target.name,
                    saved.display()
                );
            }
            Err(TestError::Abort(why)) => panic!("fuzz {}: aborted: {why}", target.name),
        }
        match deadline {
            Some(deadline) if Instant::now() < deadline => seed = seed.wrapping_add(1),
            _ => break,
        }
    }
    println!(
        "fuzz {}: {} seeds and {cases} cases in {:.1}s, no panic",
        target.name,
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Feeds one input: `Err` says how it panicked or that it was too slow.
fn feed(target: &Target, bytes: &[u8]) -> Result<(), String> {
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| match target.entry {
        Entry::Text(run) => run(&String::from_utf8_lossy(bytes)),
        Entry::Bytes(run) => run(bytes),
    }));
    if let Err(payload) = outcome {
        let message = payload
            .downcast_ref::<&str>()
            .map(ToString::to_string)
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        return Err(format!("panicked: {message}"));
    }
    let took = started.elapsed();
    if took > SLOW {
        return Err(format!("took {took:?} on {} bytes", bytes.len()));
    }
    Ok(())
}

// === The corpus ===

/// One corpus file.
struct Seed {
    name: String,
    bytes: Vec<u8>,
}

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// The corpus files, sorted by name; `*.hex` files are hex (whitespace and `#` comments ignored).
fn corpus(target: &Target) -> Vec<Seed> {
    let dir = corpus_dir(target.name);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz {}: {}: {e}", target.name, dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let raw = std::fs::read(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = if name.ends_with(".hex") {
                from_hex(&String::from_utf8_lossy(&raw))
                    .unwrap_or_else(|why| panic!("fuzz {}: {name}: {why}", target.name))
            } else {
                raw
            };
            Seed { name, bytes }
        })
        .collect()
}

fn from_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits: String = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .flat_map(str::split_whitespace)
        .collect();
    if !digits.len().is_multiple_of(2) {
        return Err("an odd number of hex digits".into());
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).map_err(|e| format!("{e} at digit {i}")))
        .collect()
}

fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::from("# found by the fuzzer: a netlink datagram, 16 bytes a line\n");
    for line in bytes.chunks(16) {
        let words: Vec<String> = line
            .chunks(4)
            .map(|word| word.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        out.push_str(&words.join(" "));
        out.push('\n');
    }
    out
}

/// Writes a found input into the corpus as `found-<hash>` (`.hex` for a bytes target).
fn save(target: &Target, bytes: &[u8]) -> PathBuf {
    // FNV-1a: a stable name for the same input.
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let (name, content) = match target.entry {
        Entry::Text(_) => (format!("found-{hash:016x}"), bytes.to_vec()),
        Entry::Bytes(_) => (format!("found-{hash:016x}.hex"), to_hex(bytes).into_bytes()),
    };
    let path = corpus_dir(target.name).join(name);
    std::fs::write(&path, content).unwrap_or_else(|e| panic!("saving {}: {e}", path.display()));
    path
}

// === Cases ===

/// One generated input.
#[derive(Debug, Clone)]
enum Case {
    /// Made from nothing.
    Arbitrary(Vec<u8>),
    /// A corpus seed, mutated step by step.
    Mutated(Index, Vec<Mutation>),
}

impl Case {
    fn bytes(&self, seeds: &[Seed]) -> Vec<u8> {
        match self {
            Self::Arbitrary(bytes) => bytes.clone(),
            Self::Mutated(seed, steps) => {
                let mut bytes = seeds[seed.index(seeds.len())].bytes.clone();
                for step in steps {
                    step.apply(&mut bytes, seeds);
                    bytes.truncate(MAX_LEN);
                }
                bytes
            }
        }
    }
}

/// One step of a mutation. Positions are [`Index`]es, resolved against the input as it is then.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    /// A range copied to another place.
    Duplicate(Index, usize, Index),
    Truncate(Index),
    /// Lines of a seed (`seed`, from line `from`, `count` lines) inserted before line `at`.
    SpliceLines {
        seed: Index,
        from: Index,
        count: usize,
        at: Index,
    },
    /// Bytes of a seed inserted at `at`.
    SpliceBytes {
        seed: Index,
        from: Index,
        len: usize,
        at: Index,
    },
    /// One line repeated: duplicate keys, thousands of entries.
    RepeatLine(Index, usize),
    SwapLines(Index, Index),
    /// A scalar (a run of bytes between YAML/JSON punctuation) replaced.
    Scalar(Index, Value),
    /// A 16- or 32-bit little-endian field at an even offset set or nudged (netlink lengths and types).
    Word(Index, Width, WordOp),
}

#[derive(Debug, Clone, Copy)]
enum Width {
    U16,
    U32,
}

#[derive(Debug, Clone, Copy)]
enum WordOp {
    Set(u32),
    Add(i8),
}

/// A replacement scalar.
#[derive(Debug, Clone)]
enum Value {
    Fixed(&'static str),
    /// One character, many times.
    Long(char, usize),
    /// Collections nested this deep.
    Nested(Nest, usize),
    /// Anchors and aliases, nine more copies per level.
    Bomb(usize),
}

#[derive(Debug, Clone, Copy)]
enum Nest {
    FlowList,
    FlowMap,
    JsonObject,
    /// `- - - x`
    CompactList,
    /// `a:` lines, each indented one more.
    BlockMap,
}

/// Scalars that break parsers and validators: boundary numbers, odd addresses, YAML specials.
const EXTREMES: &[&str] = &[
    "",
    "0",
    "-0",
    "-1",
    "1",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "1e309",
    "-1e309",
    "1.5",
    "1e-400",
    "NaN",
    ".nan",
    ".inf",
    "-.inf",
    "0x1F",
    "0o17",
    "0b101",
    "1_000",
    "007",
    "null",
    "~",
    "true",
    "false",
    "yes",
    "off",
    "0.0.0.0",
    "0.0.0.0/0",
    "::",
    "::/0",
    "::1",
    "::ffff:10.0.0.1",
    "10.0.0.1/33",
    "fd00::/129",
    "256.0.0.1",
    "010.001.002.003",
    "1.2.3",
    "fe80::1%eth0",
    "10.0.0.1:80",
    "TCP",
    "SCTP",
    "ICMP",
    "IPv4",
    "IPv6",
    "IPv7",
    "iptables",
    "ipvs",
    "nftables",
    "ebpf",
    "Local",
    "Cluster",
    "ClientIP",
    "all",
    "zone-",
    "node-",
    "-",
    "/",
    "a/b/c",
    "30000-32767",
    "65535-1",
    "0-0",
    "1h",
    "-1s",
    "0.0001ms",
    "99999999999999999999h",
    "\u{0}",
    "\u{7f}",
    "\u{feff}",
    "\u{202e}",
    "é",
    "🦀",
    "\\",
    "\\u0000",
    "\"",
    "'",
    "&a",
    "*a",
    "*missing",
    "!!binary AAAA",
    "!!str",
    "!!int x",
    "!!map",
    "!custom",
    "<<",
    "? ",
    "|",
    ">-",
    "%YAML 1.1",
    "---",
    "...",
    "[]",
    "{}",
    "[,]",
    "{a}",
    "a: b",
    "- x",
    "\n",
    "\t",
];

/// YAML punctuation for the token soup.
const SYNTAX: &[&str] = &[
    "\n",
    "\n  ",
    "\n    ",
    "\n- ",
    " ",
    ": ",
    "- ",
    ",",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "'",
    "# ",
    "---\n",
    "...\n",
    "&a ",
    "*a",
    "!!str ",
    "? ",
    "|\n  ",
    ">-\n  ",
    "<<: ",
    "%YAML 1.2\n",
    "\t",
    "\\",
];

/// Values for length and type fields: around zero, the header sizes, the sign bits, the maxima.
const BOUNDARY_WORDS: &[u32] = &[
    0,
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    15,
    16,
    17,
    20,
    0x7fff,
    0x8000,
    0xfffe,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
];

const LONG_CHARS: &[char] = &['a', '9', ' ', '.', ':', '-', '[', '{', '\\', '"', 'é', '\n'];

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => select(EXTREMES).prop_map(Value::Fixed),
        2 => (select(LONG_CHARS), prop_oneof![1usize..64, 1usize..20_000]).prop_map(|(c, n)| Value::Long(c, n)),
        2 => (
            select(&[Nest::FlowList, Nest::FlowMap, Nest::JsonObject, Nest::CompactList, Nest::BlockMap][..]),
            prop_oneof![1usize..80, 1usize..5_000],
        )
            .prop_map(|(nest, depth)| Value::Nested(nest, depth)),
        1 => (2usize..12).prop_map(Value::Bomb),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let len = || prop_oneof![3 => 1usize..16, 1 => 1usize..4096];
    let bytes = prop_oneof![
        vec(any::<u8>(), 1..16),
        select(EXTREMES).prop_map(|s| s.as_bytes().to_vec()),
    ];
    let word_op = prop_oneof![
        select(BOUNDARY_WORDS).prop_map(WordOp::Set),
        any::<i8>().prop_map(WordOp::Add),
    ];
    let bytewise = prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit(at, bit)),
        (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Mutation::SetByte(at, byte)),
        (any::<Index>(), bytes).prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        (any::<Index>(), len()).prop_map(|(at, n)| Mutation::Delete(at, n)),
        (any::<Index>(), len(), any::<Index>()).prop_map(|(at, n, to)| Mutation::Duplicate(at, n, to)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), any::<Index>(), len(), any::<Index>())
            .prop_map(|(seed, from, len, at)| Mutation::SpliceBytes { seed, from, len, at }),
        (any::<Index>(), select(&[Width::U16, Width::U32][..]), word_op)
            .prop_map(|(at, width, op)| Mutation::Word(at, width, op)),
    ];
    let structured = prop_oneof![
        1 => (any::<Index>(), any::<Index>(), 1usize..40, any::<Index>())
            .prop_map(|(seed, from, count, at)| Mutation::SpliceLines { seed, from, count, at }),
        1 => (any::<Index>(), prop_oneof![1usize..4, 1usize..3_000]).prop_map(|(at, n)| Mutation::RepeatLine(at, n)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        4 => (any::<Index>(), value()).prop_map(|(at, value)| Mutation::Scalar(at, value)),
    ];
    prop_oneof![1 => bytewise, 1 => structured]
}

/// Arbitrary input for an entry point: random bytes; for text, random text and a soup of YAML
/// punctuation, extremes and the seeds' own words; for bytes, netlink attribute soup too.
fn arbitrary(entry: Entry, tokens: Vec<String>) -> BoxedStrategy<Vec<u8>> {
    let raw = vec(any::<u8>(), 0..2048);
    match entry {
        Entry::Text(_) => {
            let soup = vec(select(tokens), 0..400).prop_map(|parts| parts.concat().into_bytes());
            prop_oneof![
                1 => raw,
                1 => any::<String>().prop_map(String::into_bytes),
                4 => soup,
            ]
            .boxed()
        }
        Entry::Bytes(_) => prop_oneof![1 => raw, 3 => nla_soup()].boxed(),
    }
}

/// The words a soup is made of: punctuation, extremes and every distinct short scalar of the seeds.
fn tokens(seeds: &[Seed]) -> Vec<String> {
    let mut words: Vec<String> = seeds
        .iter()
        .flat_map(|seed| {
            scalar_spans(&seed.bytes)
                .into_iter()
                .map(|span| String::from_utf8_lossy(&seed.bytes[span]).into_owned())
        })
        .filter(|word| word.len() <= 64)
        .collect();
    words.sort();
    words.dedup();
    words.truncate(2_000);
    words.extend(SYNTAX.iter().chain(EXTREMES).map(ToString::to_string));
    words
}

/// A netlink datagram (nlmsghdr, genlmsghdr) of well-formed attributes with arbitrary kinds, nesting
/// and values: what gets past the length checks to the attribute parsers.
fn nla_soup() -> impl Strategy<Value = Vec<u8>> {
    let leaf = (0u16..20, vec(any::<u8>(), 0..24));
    let top = (0u16..5, any::<bool>(), vec(leaf, 0..12));
    (0u8..10, vec(top, 0..4), select(&[16u16, 2, 3, 0x1c][..])).prop_map(|(command, attrs, kind)| {
        let mut payload = vec![command, 1, 0, 0];
        for (kind, nested_flag, leaves) in attrs {
            let mut inner = Vec::new();
            for (leaf_kind, value) in leaves {
                push_nla(&mut inner, leaf_kind, &value);
            }
            push_nla(&mut payload, kind | if nested_flag { 0x8000 } else { 0 }, &inner);
        }
        let mut datagram = Vec::with_capacity(payload.len() + 16);
        datagram.extend_from_slice(&(payload.len() as u32 + 16).to_le_bytes());
        datagram.extend_from_slice(&kind.to_le_bytes());
        datagram.extend_from_slice(&2u16.to_le_bytes()); // NLM_F_MULTI
        datagram.extend_from_slice(&1u32.to_le_bytes()); // sequence
        datagram.extend_from_slice(&0u32.to_le_bytes()); // port
        datagram.extend_from_slice(&payload);
        datagram
    })
}

fn push_nla(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = (value.len() + 4).min(usize::from(u16::MAX));
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&value[..len - 4]);
    out.resize(out.len().next_multiple_of(4), 0);
}

// === Applying mutations ===

impl Mutation {
    fn apply(&self, input: &mut Vec<u8>, seeds: &[Seed]) {
        let len = input.len();
        match self {
            Self::FlipBit(at, bit) if len > 0 => input[at.index(len)] ^= 1 << bit,
            Self::SetByte(at, byte) if len > 0 => input[at.index(len)] = *byte,
            Self::Insert(at, bytes) => {
                let at = at.index(len + 1);
                input.splice(at..at, bytes.iter().copied());
            }
            Self::Delete(at, n) if len > 0 => {
                let at = at.index(len);
                input.drain(at..(at + n).min(len));
            }
            Self::Duplicate(from, n, to) if len > 0 => {
                let from = from.index(len);
                let chunk = input[from..(from + n).min(len)].to_vec();
                let to = to.index(len + 1);
                input.splice(to..to, chunk);
            }
            Self::Truncate(at) => input.truncate(at.index(len + 1)),
            Self::SpliceLines {
                seed,
                from,
                count,
                at,
            } => {
                let other = &seeds[seed.index(seeds.len())].bytes;
                let lines = line_spans(other);
                if lines.is_empty() {
                    return;
                }
                let first = from.index(lines.len());
                let last = (first + count).min(lines.len()) - 1;
                let mut chunk = other[lines[first].start..lines[last].end].to_vec();
                if !chunk.ends_with(b"\n") {
                    chunk.push(b'\n');
                }
                let mine = line_spans(input);
                let at = if mine.is_empty() {
                    0
                } else {
                    mine[at.index(mine.len())].start
                };
                input.splice(at..at, chunk);
            }
            Self::SpliceBytes {
                seed,
                from,
                len: n,
                at,
            } => {
                let other = &seeds[seed.index(seeds.len())].bytes;
                if other.is_empty() {
                    return;
                }
                let from = from.index(other.len());
                let chunk = other[from..(from + n).min(other.len())].to_vec();
                let at = at.index(len + 1);
                input.splice(at..at, chunk);
            }
            Self::RepeatLine(at, times) => {
                let lines = line_spans(input);
                if lines.is_empty() {
                    return;
                }
                let line = lines[at.index(lines.len())].clone();
                let mut copy = input[line.clone()].to_vec();
                if !copy.ends_with(b"\n") {
                    copy.push(b'\n');
                }
                let copies = copy.repeat((*times).min(MAX_LEN / copy.len().max(1)));
                input.splice(line.start..line.start, copies);
            }
            Self::SwapLines(a, b) => {
                let lines = line_spans(input);
                if lines.is_empty() {
                    return;
                }
                let (a, b) = (a.index(lines.len()), b.index(lines.len()));
                let (first, second) = (lines[a.min(b)].clone(), lines[a.max(b)].clone());
                if first == second {
                    return;
                }
                let mut out = Vec::with_capacity(len);
                out.extend_from_slice(&input[..first.start]);
                out.extend_from_slice(&input[second.clone()]);
                out.extend_from_slice(&input[first.end..second.start]);
                out.extend_from_slice(&input[first]);
                out.extend_from_slice(&input[second.end..]);
                *input = out;
            }
            Self::Scalar(at, value) => {
                let spans = scalar_spans(input);
                if spans.is_empty() {
                    return;
                }
                let span = spans[at.index(spans.len())].clone();
                input.splice(span, value.render());
            }
            Self::Word(at, width, op) => {
                let size = match width {
                    Width::U16 => 2,
                    Width::U32 => 4,
                };
                if len < size {
                    return;
                }
                let at = at.index((len - size) / 2 + 1) * 2;
                let field = &mut input[at..at + size];
                let mut old = [0u8; 4];
                old[..size].copy_from_slice(field);
                let new = match op {
                    WordOp::Set(value) => *value,
                    WordOp::Add(delta) => u32::from_le_bytes(old).wrapping_add(*delta as i32 as u32),
                };
                field.copy_from_slice(&new.to_le_bytes()[..size]);
            }
            // Mutations of a byte that an empty input lacks.
            Self::FlipBit(..) | Self::SetByte(..) | Self::Delete(..) | Self::Duplicate(..) => {}
        }
    }
}

impl Value {
    fn render(&self) -> Vec<u8> {
        match self {
            Self::Fixed(text) => text.as_bytes().to_vec(),
            Self::Long(c, n) => c.to_string().repeat(*n).into_bytes(),
            Self::Nested(nest, depth) => {
                let d = *depth;
                match nest {
                    Nest::FlowList => format!("{}1{}", "[".repeat(d), "]".repeat(d)),
                    Nest::FlowMap => format!("{}1{}", "{a: ".repeat(d), "}".repeat(d)),
                    Nest::JsonObject => format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d)),
                    Nest::CompactList => format!("{}1", "- ".repeat(d)),
                    Nest::BlockMap => (0..d).map(|i| format!("\n{}a:", " ".repeat(i + 1))).collect(),
                }
                .into_bytes()
            }
            Self::Bomb(levels) => {
                let mut text = String::from("[&a0 [x, x, x, x, x, x, x, x, x]");
                for level in 1..*levels {
                    let previous = format!("*a{}", level - 1);
                    text.push_str(&format!(", &a{level} [{}]", vec![previous; 9].join(", ")));
                }
                text.push(']');
                text.into_bytes()
            }
        }
    }
}

/// Every line, with its newline.
fn line_spans(bytes: &[u8]) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut start = 0;
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'\n' {
            spans.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < bytes.len() {
        spans.push(start..bytes.len());
    }
    spans
}

/// Runs of bytes between whitespace and YAML/JSON punctuation: keys, values, numbers, addresses.
fn scalar_spans(bytes: &[u8]) -> Vec<Range<usize>> {
    let is_separator = |b: u8| b" \t\r\n{}[],:\"'#".contains(&b);
    let mut spans = Vec::new();
    let mut start = None;
    for (i, b) in bytes.iter().enumerate() {
        match (start, is_separator(*b)) {
            (None, false) => start = Some(i),
            (Some(s), true) => {
                spans.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        spans.push(s..bytes.len());
    }
    spans
}

// === Budget ===

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let word = seed
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(i as u32 * 16)
            ^ i as u64;
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    bytes
}

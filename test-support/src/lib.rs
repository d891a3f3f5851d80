//! Test doubles shared by the workspace's tests and benchmarks, in a crate of their own so that no
//! shipped binary carries them and no crate dev-depends on another just to get them.
//!
//! ```text
//! kube::Client ◄── tower-test mock ◄── fake_apiserver::FakeApiServer (state-based: objects, resourceVersions,
//!                                        SSA field owners, status subresource, label selectors, watches
//!                                        with bookmarks and 410 relists, injected faults)
//!   used by: controller tests and benches · agent tests · e2e (fault suite, demo-cluster test)
//! announce::announce ─► a result line on stderr that `cargo test` does not swallow (fault suites)
//! scratch::dir ─► a scratch folder named after its process, removed on drop; scratch::sweep ─► those of
//!                 processes that are gone (switchyard-lab gc)
//! synthetic::Shape ─► synthetic::cluster ─► Services, EndpointSlices, Nodes (benchmarks, scale and
//!                                            fault suites; never semantics tests)
//! odd_values::{service, endpoint_slice, node} ─► odd_values ─► one odd value per field (tolerant
//!                                            decoding: unit tests, the real API server's cluster suite)
//! ```

pub mod announce;
pub mod fake_apiserver;
pub mod odd_values;
pub mod scratch;
pub mod synthetic;

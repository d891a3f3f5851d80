//! Watch events of the API's objects, as both the controller and the agent reduce them before keeping
//! them: pure mapping over kube-runtime's event type (behind the `runtime` feature; no client).
//!
//! ```text
//! watcher::Event<NodeForwardingPlan | ForwardingSlice> ─► map_event(f) ─► watcher::Event<what the caller keeps>
//! ```

use kube::runtime::watcher;

/// Maps the objects of a watch event (kube-runtime offers only an in-place `modify`).
pub fn map_event<K, T>(event: watcher::Event<K>, f: impl Fn(K) -> T) -> watcher::Event<T> {
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_objects_and_keeps_markers() {
        let mapped: Vec<watcher::Event<usize>> = vec![
            watcher::Event::Init,
            watcher::Event::InitApply("ab"),
            watcher::Event::InitDone,
            watcher::Event::Apply("abc"),
            watcher::Event::Delete("a"),
        ]
        .into_iter()
        .map(|e| map_event(e, str::len))
        .collect();
        assert!(matches!(
            mapped.as_slice(),
            [
                watcher::Event::Init,
                watcher::Event::InitApply(2),
                watcher::Event::InitDone,
                watcher::Event::Apply(3),
                watcher::Event::Delete(1),
            ]
        ));
    }
}

//! What an object's metadata says about who last wrote its spec, and when.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::ObjectMeta, jiff::Timestamp};

use crate::names::CONTROLLER_FIELD_MANAGER;

/// When the object's spec was last written, as honestly as the metadata tells: the `time` of the
/// `switchyard-controller` entry in `managedFields` (the API server moves it whenever that manager
/// changes a field it owns); without one, the latest entry of any manager that did not write through a
/// subresource (whoever last edited the spec by hand); without managedFields at all, the creation time.
/// Status writes never count.
pub fn written_at(meta: &ObjectMeta) -> Option<Timestamp> {
    let fields = meta.managed_fields.as_deref().unwrap_or_default();
    let main = || {
        fields
            .iter()
            .filter(|f| f.subresource.as_deref().unwrap_or_default().is_empty())
    };
    let controller = main()
        .filter(|f| f.manager.as_deref() == Some(CONTROLLER_FIELD_MANAGER))
        .filter_map(|f| f.time.as_ref())
        .max();
    let any = || main().filter_map(|f| f.time.as_ref()).max();
    controller
        .or_else(any)
        .or(meta.creation_timestamp.as_ref())
        .map(|t| t.0)
}

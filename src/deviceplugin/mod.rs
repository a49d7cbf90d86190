//! The kubelet device plugin (API v1beta1 over gRPC): advertises the node's GPU memory, core
//! percentage and GPU count as extended resources and returns the grant annotations from
//! `Allocate`.

/// Generated from `protos/deviceplugin_v1beta1.proto` (see build.rs).
#[allow(clippy::all, missing_docs)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

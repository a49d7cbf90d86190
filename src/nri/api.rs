//! Generated NRI protobuf messages and ttrpc services (see `build.rs` and `protos/SOURCES`).
#![allow(
    clippy::all,
    clippy::pedantic,
    dead_code,
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    trivial_casts,
    unused_attributes,
    unused_imports,
    unused_results,
    unused_mut,
    unused_qualifications,
    unknown_lints
)]

#[rustfmt::skip]
pub mod nri_api {
    include!(concat!(env!("OUT_DIR"), "/nri_api.rs"));
}

#[rustfmt::skip]
pub mod nri_api_ttrpc {
    include!(concat!(env!("OUT_DIR"), "/nri_api_ttrpc.rs"));
}

//! Generates the NRI protobuf messages and async ttrpc service code from the vendored
//! `protos/nri_api.proto` with ttrpc-codegen (pure-Rust parser; no protoc needed).

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=protos/nri_api.proto");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    ttrpc_codegen::Codegen::new()
        .out_dir(&out)
        .input("protos/nri_api.proto")
        .include("protos")
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize {
            async_all: true,
            gen_mod: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ttrpc_codegen::ProtobufCustomize::default().gen_mod_rs(true))
        .run()?;
    // `include!` cannot take inner attributes (`#![allow(..)]`); src/nri/api.rs puts the
    // equivalent outer attributes on the modules instead.
    for name in ["nri_api.rs", "nri_api_ttrpc.rs"] {
        let path = std::path::Path::new(&out).join(name);
        let text = std::fs::read_to_string(&path)?;
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("#![") && !l.starts_with("//!"))
            .collect();
        std::fs::write(&path, kept.join("\n"))?;
    }
    Ok(())
}

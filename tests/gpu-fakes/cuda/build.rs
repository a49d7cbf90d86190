fn main() {
    // Loaded as the driver: the soname is what programs linked with -lcuda record.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}

//! Compile the OTLP trace subset with protox (pure Rust), as the proto crate does.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let file = dir.join("otlp_trace.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        // The server half is for the test collector only; it costs nothing at run time.
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}

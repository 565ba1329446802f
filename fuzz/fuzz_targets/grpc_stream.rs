//! The CMP gRPC request stream (any order, size and framing of header and chunk messages)
//! through the real service with a runner that runs nothing: see `grpc_stream`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cmp_warden_fuzz::grpc_stream(data));

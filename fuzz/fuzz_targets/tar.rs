//! (b) Raw bytes as a tar stream (gzip added), so the fuzzer works on headers directly.
#![no_main]
libfuzzer_sys::fuzz_target!(
    |data: &[u8]| cmp_warden_fuzz::run_tgz(&cmp_warden_fuzz::gzip_fast(data))
);

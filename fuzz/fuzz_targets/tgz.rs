//! (a) Raw bytes as a tar.gz through the whole pipeline.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cmp_warden_fuzz::run_tgz(data));

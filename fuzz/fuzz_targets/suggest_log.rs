//! `policy suggest`'s audit-log input: see `suggest_log`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cmp_warden_fuzz::suggest_log(data));

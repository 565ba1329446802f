//! Policy files and directories: parse or refuse, never panic; what parses round-trips
//! through what `policy suggest` writes; a directory that loads selects in range.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cmp_warden_fuzz::policy_text(data));

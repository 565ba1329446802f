//! The ApplicationSet generator's HTTP front door: any bytes on a connection, through the
//! server's own connection handler: no panic, no hang, no 5xx, 200 only when authenticated.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cmp_warden_fuzz::appset_connection(data));

//! The HTTP/2 :authority rewriter: arbitrary client bytes, split anywhere, never panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let split = data.first().copied().unwrap_or(0) as usize * 7;
    server::authority::fuzz_feed(data, split);
});

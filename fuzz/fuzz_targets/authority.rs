//! The HTTP/2 :authority rewriter: arbitrary client bytes never panic, and how they are split
//! into reads does not matter: the same output and the same verdict as in one piece.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let split = data.first().copied().unwrap_or(0) as usize * 7;
    server::authority::fuzz_feed(data, split);
});

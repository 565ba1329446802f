//! Generate-output splitting on any bytes: never a panic, and every manifest grammatical JSON
//! (numbers are not range-checked: Go's json.Decoder passes raw values through unparsed, and
//! so does cmp-warden, so `1e999` is a valid document here exactly as in Argo CD). What each
//! manifest is, byte for byte, is `split_differential`'s to check against Argo CD's own code;
//! this target needs no Go build, so it runs with the others.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(docs) = plugin::split_output_within(data, 16 << 20) {
        for d in &docs {
            assert!(
                serde_json::from_str::<Box<serde_json::value::RawValue>>(d).is_ok(),
                "split produced invalid JSON: {d}"
            );
        }
    }
});

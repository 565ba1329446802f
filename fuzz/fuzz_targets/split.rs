//! Generate-output splitting: every returned document must itself be grammatical JSON. (Numbers
//! are not range-checked: Go's json.Decoder passes raw values through unparsed, and so do we, so
//! `1e999` is a valid document here exactly as in Argo CD.)
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(docs) = plugin::split_manifests(s)
    {
        for d in docs {
            assert!(
                serde_json::from_str::<Box<serde_json::value::RawValue>>(&d).is_ok(),
                "split produced invalid JSON: {d}"
            );
        }
    }
});

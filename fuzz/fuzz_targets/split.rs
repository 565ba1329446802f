//! Generate-output splitting: every returned document must itself be valid JSON.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(docs) = plugin::split_manifests(s)
    {
        for d in docs {
            assert!(serde_json::from_str::<serde_json::Value>(&d).is_ok(), "split produced invalid JSON: {d}");
        }
    }
});

//! Generate-output splitting: every returned document must itself be grammatical JSON (numbers
//! are not range-checked: Go's json.Decoder passes raw values through unparsed, and so do we,
//! so `1e999` is a valid document here exactly as in Argo CD); and splitting is a round trip:
//! the documents joined as a YAML stream split into the same documents.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(docs) = plugin::split_manifests(s)
    {
        for d in &docs {
            assert!(
                serde_json::from_str::<Box<serde_json::value::RawValue>>(d).is_ok(),
                "split produced invalid JSON: {d}"
            );
        }
        let joined = docs.join("\n---\n");
        let again = plugin::split_manifests(&joined)
            .unwrap_or_else(|e| panic!("its own output does not split: {e}\n{joined}"));
        assert_eq!(again, docs, "splitting is not a round trip");
    }
});

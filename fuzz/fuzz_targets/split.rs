//! Generate-output splitting: every returned document must itself be grammatical JSON (numbers
//! are not range-checked: Go's json.Decoder passes raw values through unparsed, and so do we,
//! so `1e999` is a valid document here exactly as in Argo CD); and splitting is a round trip:
//! the documents joined back into a stream of the kind they came from (concatenated JSON
//! values, or YAML documents) split into as many documents — the same ones for JSON, which is
//! passed through; for YAML, which Go's rules convert (`-0.0` becomes `-0`, which reads back
//! as the integer `0`), the same ones from the second pass on.
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
        // Which reader took it: a stream starting with `{` that is all JSON values is read as
        // JSON (raw values kept); anything else as YAML (each document converted).
        let json_stream = s.trim_start().starts_with('{')
            && serde_json::Deserializer::from_str(s)
                .into_iter::<&serde_json::value::RawValue>()
                .all(|v| v.is_ok());
        let sep = if json_stream { "\n" } else { "\n---\n" };
        let resplit = |docs: &[String]| {
            let joined = docs.join(sep);
            plugin::split_manifests(&joined)
                .unwrap_or_else(|e| panic!("its own output does not split: {e}\n{joined}"))
        };
        let again = resplit(&docs);
        assert_eq!(
            again.len(),
            docs.len(),
            "documents merged or lost: {docs:?} → {again:?}"
        );
        if json_stream {
            assert_eq!(again, docs, "JSON values are not passed through");
        } else {
            assert_eq!(resplit(&again), again, "YAML conversion has no fixed point");
        }
    }
});

//! plugin.yaml parsing: any text must parse or fail cleanly, never panic or blow up.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = plugin::PluginConfig::parse(s);
    }
});

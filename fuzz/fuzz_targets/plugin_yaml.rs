//! plugin.yaml parsing: any text must parse or fail cleanly, never panic or blow up; and what
//! parses round-trips: written back as plugin.yaml and parsed again, it is the same config.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(loaded) = plugin::PluginConfig::parse(s)
    {
        let again = cmp_warden_fuzz::plugin_yaml(&loaded.config);
        let back = plugin::PluginConfig::parse(&again)
            .unwrap_or_else(|e| panic!("the written-back config does not parse: {e}\n{again}"));
        assert_eq!(
            back.config, loaded.config,
            "round trip changed the config\n{again}"
        );
    }
});

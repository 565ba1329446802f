//! Differential fuzzing against Argo CD's own code: each input (its first byte's parity picks
//! a generate command's output or a dynamic parameters command's) is read by `argo-split`
//! (Argo CD's `kube.SplitYAMLToString` and `json.Unmarshal`, built by
//! `scripts/argo-build v3 --driver`; `$CMP_WARDEN_ARGO_SPLIT` or scripts/argo-build's cache)
//! and by cmp-warden's readers; any difference — a manifest byte, accept or refuse, an error's
//! text — is a crash.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    cmp_warden_fuzz::split_differential(data);
});

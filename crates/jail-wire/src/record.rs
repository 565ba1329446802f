//! The run record's side channel while a request runs (the runner fills it, the service logs
//! it), and the clock its timestamps read. The record itself is `vocab::record`.

use std::sync::{Arc, Mutex};

use vocab::record::RunRecord;

/// Now, in nanoseconds since the Unix epoch (what records and trace spans carry).
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Shared between the runner (which fills it) and the service (which logs it).
pub type Recorder = Arc<Mutex<RunRecord>>;

/// Update the record behind `r` (a poisoned lock still records).
pub fn update(r: &Recorder, f: impl FnOnce(&mut RunRecord)) {
    f(&mut r.lock().unwrap_or_else(|e| e.into_inner()));
}

/// A copy of the record.
pub fn snapshot(r: &Recorder) -> RunRecord {
    r.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

//! The one raw system call the safe wrappers cannot express: `kill(-1, SIGKILL)`.
#![allow(unsafe_code)]

use std::io;

/// Send SIGKILL to every process this process may signal (all of the caller's real UID's
/// processes except itself). Called only by the reclaim helper after it switched to a
/// request's unique UID, so "every process" means exactly that request's processes.
/// Returns `Ok(false)` on ESRCH (no other process at all).
pub fn kill_all_of_my_uid() -> io::Result<bool> {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; -1 is the documented
    // "all permitted processes" target. rustix's `Pid` cannot express -1.
    let r = unsafe { libc::kill(-1, libc::SIGKILL) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(false)
    } else {
        Err(e)
    }
}
